#!/usr/bin/env python3
"""`make lint`: every plugin of the collection sparkfleet.cluster is documented, and truly.

- Modules: DOCUMENTATION, RETURN and EXAMPLES parse as YAML (a duplicate key is an error, not the
  warning Ansible gives) and have the fields ansible-doc shows; the options are exactly the argument
  spec the module really builds (main() is run with a stand-in AnsibleModule that records its
  arguments): names, type, required, default, choices, elements, aliases, no_log; EXAMPLES are tasks
  calling the module by its FQCN with documented options only.
- Filters: each filter a FilterModule returns has a sidecar YAML (plugins/filter/<name>.yml) whose
  options are the filter function's parameters.
- Action plugins without a module of their name, and the strategy plugin, are documented too.
- description and short_description are text (a string or a list of strings): a plain YAML item
  holding ': ' is a mapping, which ansible-doc cannot render (issue 25).
- The real ansible-doc, as a user runs it, over every plugin type of plugins/ and every role of
  roles/: `ansible-doc -t <type> -l sparkfleet.cluster` lists each, and `ansible-doc -t <type> <fqcn>`
  renders each as text (not --json: the JSON dump skips the text formatting that fails) with exit 0,
  nothing on stderr and a page for every name. One call per type; when a batch fails, every name is
  rendered alone, so each broken plugin is named (ansible-doc stops at the first).

ansible-test sanity's validate-modules needs packages this project does not pin (voluptuous,
antsibull-docs-parser) and a checkout at ansible_collections/<ns>/<name>; this is the same check of
the documentation against the argument spec, run from the checkout with the pinned toolchain.
Exit 0 when everything holds; else one line per problem and exit 1.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "sparkfleet", "cluster"
FQCN = f"{NAMESPACE}.{NAME}"
MODULES = ROOT / "plugins/modules"
FILTERS = ROOT / "plugins/filter"
ACTIONS = ROOT / "plugins/action"
STRATEGIES = ROOT / "plugins/strategy"
DOC_KEYS = ("DOCUMENTATION", "EXAMPLES", "RETURN")
# what Ansible's argument spec assumes where a key is left out
SPEC_DEFAULTS = {"type": "str", "required": False, "default": None, "choices": None, "elements": None}
COMPARED = ("type", "required", "default", "choices", "elements", "aliases", "no_log")
# task keywords an example may carry beside the module's own arguments
TASK_KEYWORDS = {
    "name", "register", "when", "check_mode", "changed_when", "failed_when", "become", "become_user",
    "delegate_to", "run_once", "no_log", "async", "poll", "until", "retries", "delay", "loop", "vars",
    "environment", "tags", "notify", "ignore_errors", "args", "diff",
}  # fmt: skip
# plugin directories of a collection that ansible-doc documents, by its plugin type (-t)
DOC_TYPES = {
    "modules": "module", "filter": "filter", "test": "test", "strategy": "strategy", "lookup": "lookup",
    "callback": "callback", "connection": "connection", "inventory": "inventory", "become": "become",
    "cache": "cache", "vars": "vars", "shell": "shell", "cliconf": "cliconf", "httpapi": "httpapi",
    "netconf": "netconf",
}  # fmt: skip
# plugin directories ansible-doc has no type for: an action is documented by plugins/modules/<name>.py
# (-t module renders it), the others hold code that plugins import
NOT_DOC_TYPES = {"action", "module_utils", "plugin_utils", "doc_fragments", "terminal"}
# stderr of ansible-doc that is not about documentation: ansible-core deprecates every strategy
# plugin outside ansible.builtin (plugins/strategy/sparkfleet.py is one) when it lists them
NOT_ABOUT_DOCS = (
    "[DEPRECATION WARNING]: Use of strategy plugins not included in ansible.builtin are deprecated",
    "[WARNING]: Deprecation warnings can be disabled",
)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml(text: str, where: str, problems: list[str]) -> Any:
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        problems.append(f"{where}: not valid YAML: {' '.join(str(exc).split())}")
        return None


def doc_strings(path: Path) -> dict[str, str]:
    """The DOCUMENTATION, EXAMPLES and RETURN constants of a Python file (read as ansible-doc reads them)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in DOC_KEYS
            and isinstance(node.value, ast.Constant)
        ):
            out[node.targets[0].id] = node.value.value
    return out


def importable_collection() -> None:
    """Plugins import ansible_collections.sparkfleet.cluster...: found through the checkout's link."""
    collections = ROOT / ".collections"
    if str(collections) not in sys.path:
        sys.path.insert(0, str(collections))


def load_python(path: Path, name: str) -> Any:
    """Import a plugin file under `name` (registered first: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---- the argument spec a module really builds -------------------------------------------------------
class _Captured(Exception):
    def __init__(self, kwargs: dict):
        super().__init__("captured")
        self.kwargs = kwargs


class _RecordingModule:
    def __init__(self, *args: Any, **kwargs: Any):
        if args:
            kwargs["argument_spec"] = args[0]
        raise _Captured(kwargs)


def argument_spec(path: Path) -> dict:
    """The keyword arguments the module's main() passes to AnsibleModule (main() stops right there)."""
    from ansible.module_utils import basic

    importable_collection()
    real = basic.AnsibleModule
    basic.AnsibleModule = _RecordingModule
    try:
        mod = load_python(path, f"_sparkfleet_doccheck_{path.stem}")
        if getattr(mod, "AnsibleModule", _RecordingModule) is not _RecordingModule:
            mod.AnsibleModule = _RecordingModule
        try:
            mod.main()
        except _Captured as got:
            return got.kwargs
        raise RuntimeError("main() returned without building an AnsibleModule")
    finally:
        basic.AnsibleModule = real


def compare_options(where: str, spec: dict, doc: dict, problems: list[str]) -> None:
    for name in sorted(set(spec) - set(doc)):
        problems.append(f"{where}: option {name} is in the argument spec but not documented")
    for name in sorted(set(doc) - set(spec)):
        problems.append(f"{where}: option {name} is documented but not in the argument spec")
    for name in sorted(set(spec) & set(doc)):
        s, d = spec[name] or {}, doc[name] or {}
        if not isinstance(d, dict):
            problems.append(f"{where}: option {name}: its documentation is not a mapping")
            continue
        if not d.get("description"):
            problems.append(f"{where}: option {name} has no description")
        for key in COMPARED:
            want = s.get(key, SPEC_DEFAULTS.get(key))
            have = d.get(key, SPEC_DEFAULTS.get(key))
            if key in ("aliases",):
                want, have = sorted(want or []), sorted(have or [])
            if key == "no_log":
                want, have = bool(want), bool(have)
            if key == "default" and want is not None and s.get("type") == "float":
                have = float(have) if isinstance(have, (int, float)) else have
            if want != have:
                problems.append(
                    f"{where}: option {name}: {key} is {have!r} in the docs, {want!r} in the spec"
                )
        if s.get("options") or d.get("suboptions"):
            compare_options(f"{where}.{name}", s.get("options") or {}, d.get("suboptions") or {}, problems)


def check_examples(where: str, text: str, module: str, options: dict, problems: list[str]) -> None:
    tasks = load_yaml(text, f"{where} EXAMPLES", problems)
    if tasks is None:
        return
    if not isinstance(tasks, list) or not tasks:
        problems.append(f"{where} EXAMPLES: not a list of tasks")
        return
    fqcn = f"{FQCN}.{module}"
    for n, task in enumerate(tasks, start=1):
        if not isinstance(task, dict) or fqcn not in task:
            problems.append(f"{where} EXAMPLES task {n}: does not call {fqcn}")
            continue
        if not task.get("name"):
            problems.append(f"{where} EXAMPLES task {n}: has no name")
        unknown = sorted(set(task) - TASK_KEYWORDS - {fqcn})
        if unknown:
            problems.append(f"{where} EXAMPLES task {n}: unknown keys {unknown}")
        args = task[fqcn] or {}
        if isinstance(args, dict):
            extra = sorted(set(args) - set(options))
            if extra:
                problems.append(f"{where} EXAMPLES task {n}: undocumented options {extra}")


def check_header(where: str, doc: dict, key: str, name: str, problems: list[str]) -> None:
    """DOCUMENTATION names the plugin (`module:` or `name:`) and says what it is and who wrote it."""
    if doc.get(key) != name:
        problems.append(f"{where}: DOCUMENTATION names {key} {doc.get(key)!r}, the plugin is {name}")
    for field in ("short_description", "description", "author"):
        if not doc.get(field):
            problems.append(f"{where}: DOCUMENTATION has no {field}")
    check_texts(f"{where} DOCUMENTATION", doc, problems)


def check_texts(where: str, doc: Any, problems: list[str], at: str = "") -> None:
    """description and short_description, here and in every option, suboption and returned value,
    are a string or a list of strings: ansible-doc formats them as text and fails on anything else."""
    if not isinstance(doc, dict):
        return
    for field in ("short_description", "description"):
        value = doc.get(field)
        items = value if isinstance(value, list) else [value]
        for n, item in enumerate(items, start=1):
            if item is not None and not isinstance(item, str):
                which = f"{at}{field}" + (f" item {n}" if isinstance(value, list) else "")
                hint = (
                    " (a plain YAML item holding ': ' is a mapping: quote it)"
                    if isinstance(item, dict)
                    else ""
                )
                problems.append(f"{where}: {which} is not text but {type(item).__name__} {item!r}{hint}")
    for sub in ("options", "suboptions", "contains"):
        entries = doc.get(sub)
        if isinstance(entries, dict):
            for name, entry in entries.items():
                check_texts(where, entry, problems, f"{at}{sub}.{name}.")


def check_return(where: str, text: str, problems: list[str]) -> None:
    doc = load_yaml(text, f"{where} RETURN", problems)
    if doc is None:
        return
    if not isinstance(doc, dict) or not doc:
        problems.append(f"{where} RETURN: not a mapping of return values")
        return
    check_texts(f"{where} RETURN", {"contains": doc}, problems)
    for key, value in doc.items():
        missing = [
            f for f in ("description", "returned", "type") if not isinstance(value, dict) or f not in value
        ]
        if missing:
            problems.append(f"{where} RETURN {key}: no {', '.join(missing)}")


def check_module(path: Path, problems: list[str]) -> None:
    where = f"plugins/modules/{path.name}"
    docs = doc_strings(path)
    for key in DOC_KEYS:
        if not docs.get(key, "").strip():
            problems.append(f"{where}: no {key}")
    doc = load_yaml(docs.get("DOCUMENTATION", ""), f"{where} DOCUMENTATION", problems)
    if not isinstance(doc, dict):
        return
    check_header(where, doc, "module", path.stem, problems)
    options = doc.get("options") or {}
    if docs.get("RETURN", "").strip():
        check_return(where, docs["RETURN"], problems)
    if docs.get("EXAMPLES", "").strip():
        check_examples(where, docs["EXAMPLES"], path.stem, options, problems)
    check_spec(path, where, doc, options, problems)


def check_spec(path: Path, where: str, doc: dict, options: dict, problems: list[str]) -> None:
    """The documented options against the argument spec the module builds (or the action accepts)."""
    if (ACTIONS / path.name).exists() and "def main(" not in path.read_text():
        # documents an action plugin: its options are the arguments the action accepts (_VALID_ARGS)
        check_action_options(where, ACTIONS / path.name, options, problems)
        return
    try:
        kwargs = argument_spec(path)
    except Exception as exc:  # a module that cannot be loaded here cannot be checked: say so, fail
        problems.append(f"{where}: could not capture its argument spec: {type(exc).__name__}: {exc}")
        return
    compare_options(where, kwargs.get("argument_spec") or {}, options, problems)
    if (ACTIONS / path.name).exists():  # an action in front of the module: its arguments are documented too
        extra = sorted((action_args(ACTIONS / path.name) or set()) - set(options))
        if extra:
            problems.append(f"{where}: the action plugin of the same name accepts undocumented {extra}")
    check_mode = bool(kwargs.get("supports_check_mode"))
    documented = ((doc.get("attributes") or {}).get("check_mode") or {}).get("support")
    if documented is not None and (documented != "none") != check_mode:
        problems.append(
            f"{where}: attributes.check_mode.support is {documented!r}, supports_check_mode={check_mode}"
        )


def check_action_options(where: str, action: Path, options: dict, problems: list[str]) -> None:
    valid = action_args(action)
    if valid is None:
        problems.append(f"plugins/action/{action.name}: no _VALID_ARGS to check its documentation against")
    elif valid != set(options):
        problems.append(f"{where}: options {sorted(options)}, the action accepts {sorted(valid)}")


def action_args(path: Path) -> set[str] | None:
    """The names in an action plugin's `_VALID_ARGS = frozenset((...))`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_VALID_ARGS" for t in node.targets)
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            return set(ast.literal_eval(node.value.args[0]))
    return None


# ---- filters ------------------------------------------------------------------------------------------
def filter_functions(directory: Path = FILTERS, kind: str = "filter") -> dict[str, tuple[str, Any]]:
    """Filter (or test) name -> (its file, its function), as the FilterModules (TestModules) return them."""
    cls, method = ("FilterModule", "filters") if kind == "filter" else ("TestModule", "tests")
    importable_collection()
    out = {}
    for path in sorted(directory.glob("*.py")):
        mod = load_python(path, f"_sparkfleet_doccheck_{kind}_{path.stem}")
        for name, fn in getattr(getattr(mod, cls)(), method)().items():
            out[name] = (path.name, fn)
    return out


def check_filter(name: str, source: str, fn: Any, problems: list[str]) -> None:
    where = f"plugins/filter/{name}.yml"
    path = FILTERS / f"{name}.yml"
    if not path.exists():
        problems.append(f"{where}: no documentation for the filter {name} (defined in {source})")
        return
    doc = load_yaml(path.read_text(), where, problems)
    if not isinstance(doc, dict):
        return
    for key in DOC_KEYS:
        if not doc.get(key):
            problems.append(f"{where}: no {key}")
    body = doc.get("DOCUMENTATION") or {}
    check_header(where, body, "name", name, problems)
    options = body.get("options") or {}
    if "_input" not in options:
        problems.append(f"{where}: no _input option (what the filter is applied to)")
    compare_parameters(where, f"{source}:{fn.__name__}", fn, options, problems)
    ret = doc.get("RETURN") or {}
    check_texts(f"{where} RETURN", {"contains": ret}, problems)
    if "_value" not in ret:
        problems.append(f"{where}: RETURN has no _value")
    if isinstance(doc.get("EXAMPLES"), str):
        load_yaml(doc["EXAMPLES"], f"{where} EXAMPLES", problems)


def compare_parameters(where: str, what: str, fn: Any, options: dict, problems: list[str]) -> None:
    """The options besides _input are the function's parameters after the first: names, required, defaults."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = list(inspect.signature(fn).parameters.values())[1:]
    wanted = {p.name: p for p in params if p.kind not in variadic}
    documented = {k: v or {} for k, v in options.items() if k != "_input"}
    for pname in sorted(set(wanted) - set(documented)):
        problems.append(f"{where}: parameter {pname} of {what} is not documented")
    for pname in sorted(set(documented) - set(wanted)):
        problems.append(f"{where}: option {pname} is not a parameter of {what}")
    for pname in sorted(set(wanted) & set(documented)):
        p, d = wanted[pname], documented[pname]
        if not d.get("description"):
            problems.append(f"{where}: option {pname} has no description")
        required = p.default is inspect.Parameter.empty
        if bool(d.get("required", False)) != required:
            problems.append(
                f"{where}: option {pname}: required {d.get('required', False)!r}, {what}: {required}"
            )
        if not required and d.get("default", None) != p.default:
            problems.append(f"{where}: option {pname}: default {d.get('default')!r}, {what}: {p.default!r}")


# ---- other plugins ------------------------------------------------------------------------------------
def check_documented_plugin(path: Path, kind: str, problems: list[str]) -> None:
    where = str(path.relative_to(ROOT))
    docs = doc_strings(path)
    doc = (
        load_yaml(docs.get("DOCUMENTATION", ""), f"{where} DOCUMENTATION", problems)
        if docs.get("DOCUMENTATION")
        else None
    )
    if not isinstance(doc, dict):
        problems.append(f"{where}: the {kind} plugin has no DOCUMENTATION")
        return
    check_header(where, doc, "name", path.stem, problems)


# ---- the real ansible-doc ----------------------------------------------------------------------------
def documented_names(root: Path, problems: list[str]) -> dict[str, list[str]]:
    """ansible-doc type -> the short names of the collection's plugins of that type; "role" -> its roles."""
    out: dict[str, list[str]] = {}
    plugins = root / "plugins"
    for directory in sorted(p for p in plugins.iterdir() if p.is_dir()) if plugins.is_dir() else ():
        kind = DOC_TYPES.get(directory.name)
        if directory.name in NOT_DOC_TYPES or directory.name == "__pycache__":
            continue
        if kind is None:
            problems.append(
                f"plugins/{directory.name}: a plugin directory check-docs does not know: "
                "add it to DOC_TYPES (ansible-doc documents it) or NOT_DOC_TYPES"
            )
            continue
        if kind in ("filter", "test"):
            names = sorted(filter_functions(directory, kind))
        else:
            names = sorted(p.stem for p in directory.glob("*.py") if p.stem != "__init__")
        if names:
            out[kind] = names
    roles = root / "roles"
    names = sorted(p.name for p in roles.iterdir() if p.is_dir()) if roles.is_dir() else []
    if names:
        out["role"] = names
    return out


def ansible_doc_env() -> dict[str, str]:
    """The environment `make lint` runs ansible-doc in: this checkout's ansible.cfg finds the collection."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS")
    }
    return {**env, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def run_ansible_doc(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, list[str]]:
    """Exit code, stdout and the stderr messages about documentation (one per message, tracebacks cut)."""
    exe = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**env, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
        check=False,
    )
    messages: list[str] = []
    traceback = False  # ansible-doc prints one after an "Unexpected Exception": its message says enough
    for line in proc.stderr.splitlines():
        if line.startswith("["):
            messages.append(line.strip())
            traceback = False
        elif line.startswith("Traceback (most recent call last)"):
            traceback = True
        elif line.strip() and not traceback:  # a message's continuation
            if messages:
                messages[-1] += " " + line.strip()
            else:
                messages.append(line.strip())
    messages = [" ".join(m.split())[:400] for m in messages if not m.startswith(NOT_ABOUT_DOCS)]
    return proc.returncode, proc.stdout, messages


# the head line of each page ansible-doc renders: "> MODULE <fqcn> (<path>)", "> ROLE: *<fqcn>* (<path>)"
PAGE = re.compile(r"^> [A-Z]+:? \*?([^\s*]+)\*? \((.+)\)$", re.MULTILINE)


def render_problems(kind: str, fqcns: list[str], root: Path, env: dict[str, str], cwd: Path) -> list[str]:
    """What goes wrong when ansible-doc renders these plugins (or roles) as text, as a user sees them."""
    rc, out, messages = run_ansible_doc(["-t", kind, *fqcns], env, cwd)
    found = []
    if rc != 0:
        found.append(f"exit {rc}")
    found += messages
    pages = {name: path for name, path in PAGE.findall(out)}
    if rc == 0:  # after a failure ansible-doc prints no page at all
        for fqcn in fqcns:
            if fqcn not in pages:
                found.append(f"no page rendered for {fqcn}")
            elif not Path(pages[fqcn]).resolve().is_relative_to(root.resolve()):
                found.append(f"{fqcn} rendered from {pages[fqcn]}, not from {root}")
    return found


def check_rendering(
    kind: str, names: list[str], problems: list[str], *, root: Path, env: dict[str, str], cwd: Path
) -> None:
    """All names in one call; if that fails, each alone: ansible-doc stops at the first broken one, and
    a role's failure ("Unexpected Exception") does not name the role."""
    fqcns = [f"{FQCN}.{n}" for n in names]
    batch = render_problems(kind, fqcns, root, env, cwd)
    if not batch:
        return
    if len(fqcns) == 1:
        problems.append(f"ansible-doc -t {kind} {fqcns[0]}: {' | '.join(batch)}")
        return
    named = False
    for fqcn in fqcns:
        alone = render_problems(kind, [fqcn], root, env, cwd)
        if alone:
            named = True
            problems.append(f"ansible-doc -t {kind} {fqcn}: {' | '.join(alone)}")
    if not named:
        problems.append(
            f"ansible-doc -t {kind} with all {len(fqcns)} names: {' | '.join(batch)} (each renders alone)"
        )


def check_listing(
    kind: str, names: list[str], problems: list[str], *, env: dict[str, str], cwd: Path
) -> None:
    """`ansible-doc -t <kind> -l sparkfleet.cluster` lists exactly these names, and says nothing on stderr."""
    rc, out, messages = run_ansible_doc(["-t", kind, "-l", FQCN], env, cwd)
    where = f"ansible-doc -t {kind} -l {FQCN}"
    if rc != 0 or messages:
        problems.append(f"{where}: exit {rc}: {' | '.join(messages)}")
    if kind == "role":  # "<fqcn>:" then its entry points, indented
        listed = {ln[:-1] for ln in out.splitlines() if ln.endswith(":") and not ln[:1].isspace()}
    else:  # "<fqcn>  <short description>"
        listed = {ln.split()[0] for ln in out.splitlines() if ln.strip() and not ln[:1].isspace()}
    wanted = {f"{FQCN}.{n}" for n in names}
    for fqcn in sorted(wanted - listed):
        problems.append(f"{where}: does not list {fqcn}")
    for fqcn in sorted(listed - wanted):
        problems.append(f"{where}: lists {fqcn}, which is not in this checkout's {kind}s")


def check_ansible_doc(
    root: Path, problems: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> dict[str, list[str]]:
    """The real ansible-doc over every plugin and role of the collection at `root`: each type listed,
    then each name rendered (two types at a time: the machine's two cores). Returns what was checked."""
    env = ansible_doc_env() if env is None else env
    cwd = root if cwd is None else cwd
    names = documented_names(root, problems)

    def one_type(kind: str) -> list[str]:
        found: list[str] = []
        check_listing(kind, names[kind], found, env=env, cwd=cwd)
        check_rendering(kind, names[kind], found, root=root, env=env, cwd=cwd)
        return found

    with ThreadPoolExecutor(max_workers=2) as pool:
        for found in pool.map(one_type, names):
            problems.extend(found)
    return names


def main() -> int:
    problems: list[str] = []
    modules = sorted(MODULES.glob("*.py"))
    for path in modules:
        check_module(path, problems)
    for path in sorted(ACTIONS.glob("*.py")):
        if not (MODULES / path.name).exists():
            problems.append(
                f"plugins/action/{path.name}: no plugins/modules/{path.name} documents the action"
            )
    filters = filter_functions()
    for name, (source, fn) in sorted(filters.items()):
        check_filter(name, source, fn, problems)
    for path in sorted(FILTERS.glob("*.yml")):
        if path.stem not in filters:
            problems.append(
                f"plugins/filter/{path.name}: documents {path.stem}, which no FilterModule returns"
            )
    strategies = sorted(STRATEGIES.glob("*.py"))
    for path in strategies:
        check_documented_plugin(path, "strategy", problems)
    rendered = check_ansible_doc(ROOT, problems)
    for line in problems:
        print(line)
    count = ", ".join(f"{len(v)} {k}" for k, v in rendered.items())
    count = (
        f"{len(modules)} modules, {len(filters)} filters, {len(strategies)} strategy; ansible-doc: {count}"
    )
    print(f"check-docs: {len(problems)} problem(s) in {count}" if problems else f"check-docs: ok ({count})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Action plugin `sparkfleet.cluster.validate`: a role's inputs, one message per broken rule.

Runs on the controller only (no connection, no module, nothing changed). For the role the task
belongs to it checks, in order:
1. every option of the role's `meta/argument_specs.yml` (entry point `main`) that has a value: its
   type, elements and choices (ansible's own validator, stricter for booleans), and the sample
   inventory's placeholder `CHANGE-ME` anywhere in it;
2. `uniform`: variables that must be equal on every node; their values are recorded, and preflight's
   verdict refuses a node whose value differs from the head's (a host_vars override);
3. `rules`, in order: `{var, kind[, min, max, pattern], fix}` (a value's format or range: the kinds of
   module_utils/input_kinds.py), `{var, that, msg}` (a cross-field rule), `{var, problems}` /
   `{var, warnings}` (an expression that returns a list of messages). Any rule may have `when`. A rule
   about a variable that already failed is skipped, so each problem is reported once, by the rule that
   owns it.
Each problem names the variable, its value and the fix. With `collect: true` (preflight layer 1 sets
`sparkfleet_validate_collect`), problems are added to the host's `sparkfleet_validation_problems`
fact instead of failing, so preflight can report every role's problems at once. Layer 1 imports each
role's tasks/validate.yml, so each role's variables come from Ansible's own precedence, as when the role
runs; the variables a role refused are carried to the next (`sparkfleet_validation_refused`).

Templates render with the variables the role's checks can reach, not all of the host's: the names in the
rules, the options and `uniform`, and, again and again, every name in those variables' values as written
(a default such as "{{ sparkfleet_state_dir }}/clocks" reaches sparkfleet_state_dir). A name is any word
of a string, so a filter's name or a word in a message only adds a variable that is not used; `hostvars`
renders another host's variables with all of that host's. Ansible wraps every variable of the context
at each render (a few hundred in layer 1, where every role's defaults are in play), which was most of
this action's time. Where a check may read a variable that no word of it names (the words `vars`,
`varnames`, `lookup`, `query`, `q`: a lookup reads variables of its own, e.g. the file lookup's
ansible_search_path), the role keeps all of them. The rules then read each option as the spec step rendered
it: ansible-core 2.19 compiles a template again at every render, and a role default written as a template
was rendered again by every rule that read it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.sparkfleet.cluster.plugins.module_utils.input_kinds import as_int, check_kind
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import yaml_files
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.ansible_private import task_role

PLACEHOLDER = "CHANGE-ME"
_ROLE_FILES: dict[tuple, tuple[dict, dict]] = {}
RAW_ARGS = ("rules",)  # evaluated one by one here, never templated up front
_TYPES = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false (a YAML boolean, no quotes)",
    "str": "a string",
    "path": "a path",
    "list": "a list",
    "dict": "a mapping",
    "raw": "any value",
}
_PLURAL = {
    "int": "whole numbers",
    "float": "numbers",
    "bool": "booleans",
    "str": "strings",
    "path": "paths",
    "list": "lists",
    "dict": "mappings",
    "raw": "values",
}


def expected(spec: dict) -> str:
    """What an option expects, in words: its type, elements and choices."""
    kind = _TYPES.get(str(spec.get("type", "raw")), str(spec.get("type")))
    if spec.get("type") == "list" and spec.get("elements"):
        kind = f"a list of {_PLURAL.get(str(spec['elements']), str(spec['elements']))}"
    if spec.get("choices"):
        kind = "one of " + ", ".join(str(c) for c in spec["choices"])
    return kind


def hint(spec: dict) -> str:
    """The first sentence of the option's description: what it is for, i.e. what to set."""
    desc = spec.get("description") or ""
    if isinstance(desc, list):
        desc = desc[0] if desc else ""
    desc = " ".join(str(desc).split())
    first = re.split(r"(?<=[.;])\s+(?=[A-Z(])", desc, maxsplit=1)[0].rstrip(".;")
    return first


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a check that reads variables no word of it names: `vars[...]`, and any lookup (the vars and varnames
# lookups name them at run time; the file lookups read ansible_search_path; the template lookup reads all)
DYNAMIC_NAMES = frozenset(("vars", "varnames", "lookup", "query", "q"))


def words(value: Any, out: set[str]) -> set[str]:
    """Every word in the strings of `value` (keys and items of containers too), added to `out`."""
    if isinstance(value, str):
        out.update(_WORD.findall(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            words(k, out)
            words(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            words(v, out)
    return out


def reachable(roots: set[str], variables: dict[str, Any]) -> set[str] | None:
    """The variables `roots` reach through the words of their values as written; None when a dynamic
    name (vars, varnames, lookup, query, q) is among the words met."""
    found: set[str] = set()
    seen = set(roots)  # every word met on the way, variable or not
    todo = [n for n in roots if n in variables]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            named = words(variables[name], set())
            seen |= named
            todo += [w for w in named if w in variables and w not in found]
    return None if DYNAMIC_NAMES & seen else found


def names_any(template: str, names: set[str]) -> bool:
    """`template` (a value written as a template) names one of `names`, as a whole word."""
    return any(re.search(rf"\b{re.escape(n)}\b", template) for n in names)


def placeholders(name: str, value: Any) -> list[str]:
    """Dotted paths inside `value` that still hold the sample inventory's placeholder."""
    if isinstance(value, str):
        return [name] if value.strip() == PLACEHOLDER else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in placeholders(f"{name}.{k}", v)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in placeholders(f"{name}[{i}]", v)]
    return []


_TYPE_PROBLEMS: dict[tuple, str | None] = {}
_PLAIN = (bool, int, float, str, list, dict, type(None))


def type_problem(name: str, value: Any, spec: dict) -> str | None:
    """One option against its spec (without defaults: only the value given). Ansible's validator copies the
    spec and the value at each call; the answer for the same name, spec and value (its plain type and its
    repr, which is all the checks and the message look at) is kept for this process (every node of a
    cluster usually has the same values)."""
    plain = next((t for t in _PLAIN if isinstance(value, t)), type(value))
    try:
        key = (name, json.dumps(spec, sort_keys=True, default=repr), plain, repr(value))
    except (TypeError, ValueError):
        return _type_problem(name, value, spec)
    if key not in _TYPE_PROBLEMS:
        if len(_TYPE_PROBLEMS) > 20000:
            _TYPE_PROBLEMS.clear()
        _TYPE_PROBLEMS[key] = _type_problem(name, value, spec)
    return _TYPE_PROBLEMS[key]


def _type_problem(name: str, value: Any, spec: dict) -> str | None:
    one = {k: v for k, v in spec.items() if k not in ("default", "required", "description", "version_added")}
    if spec.get("type") == "bool" and not isinstance(value, bool):
        return f"{name}={show(value)}: expected {expected(spec)}; {hint(spec)}"
    if spec.get("type") == "int" and isinstance(value, bool):
        return f"{name}={show(value)}: expected {expected(spec)}; {hint(spec)}"
    if spec.get("type") in ("str", "path") and not isinstance(value, str):
        return f"{name}={show(value)}: expected {expected(spec)} (in quotes); {hint(spec)}"
    result = ArgumentSpecValidator({name: one}).validate({name: value})
    if not result.error_messages:
        return None
    why = "; ".join(str(m) for m in result.error_messages)
    why = re.sub(r"^(argument|value of) '?" + re.escape(name) + r"'? ", "", why)
    return f"{name}={show(value)}: expected {expected(spec)} ({why}); {hint(spec)}"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("rules", "uniform", "collect", "entry_point", "reset"))
    COLLECTION_ROOT = Path(__file__).resolve().parents[2]

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        if name in RAW_ARGS:
            return value
        return super().finalize_task_arg(name, value, templar, context)

    # ---- values ------------------------------------------------------------------------------
    def _role_files(self) -> tuple[str, dict, dict]:
        role = task_role(self._task)  # Task._role: plugin_utils/ansible_private.py, seam 3
        if role is None:
            raise AnsibleError("sparkfleet.cluster.validate runs inside a role (tasks/validate.yml)")
        path, role_name = Path(role[0]), role[1]
        entry = str(self._task.args.get("entry_point") or "main")
        files = (path / "meta/argument_specs.yml", path / "defaults/main.yml")
        # read once per process while the files are unchanged (a process that checks many inventories, as
        # the unit tests do, reads each role once; nothing here changes what was read)
        key = (str(path), entry, tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files))
        if key not in _ROLE_FILES:
            specs = yaml_files.load(files[0].read_text()) if files[0].exists() else {}
            options = ((specs or {}).get("argument_specs") or {}).get(entry, {}).get("options") or {}
            defaults = yaml_files.load(files[1].read_text()) if files[1].exists() else {}
            _ROLE_FILES[key] = (options, defaults or {})
        options, defaults = _ROLE_FILES[key]
        return role_name, options, dict(defaults)

    def _value(self, name: str, task_vars: dict, defaults: dict) -> tuple[str, Any]:
        """('ok', value) | ('unset', None) | ('later', None): a default that needs facts | ('error', msg)."""
        if name not in task_vars:
            return "unset", None
        raw = task_vars[name]
        try:
            return "ok", self._t.template(raw)
        except AnsibleUndefinedVariable as exc:
            if name in defaults and str(raw) == str(defaults[name]):
                return "later", None  # the role's own default, computed from facts when the role runs
            return "error", f"{name}={show(raw)} cannot be evaluated: {exc.message.splitlines()[0]}"
        except AnsibleError as exc:
            if name in defaults and str(raw) == str(defaults[name]) and names_any(str(raw), self.carried_bad):
                return "later", None  # the role's default, from a variable an earlier role refused (said why)
            return "error", f"{name}={show(raw)} cannot be evaluated: {exc.message.splitlines()[0]}"

    def _from_bad(self, name: str, bad: set[str]) -> bool:
        """The value as written (the inventory's or the role's) is a template naming a refused variable:
        e.g. model_weights_snapshot_dir "{{model_weights_path}}/snapshot" with model_weights_path refused."""
        raw = (getattr(self, "raw_values", None) or {}).get(re.split(r"[.\[]", name, maxsplit=1)[0])
        if not isinstance(raw, str) or "{{" not in raw:
            return False
        return names_any(raw, bad - {name})

    @staticmethod
    def _derived(name: str, task_vars: dict, defaults: dict) -> bool:
        raw = defaults.get(name)
        return raw is not None and "{{" in str(raw) and str(task_vars.get(name)) == str(raw)

    SCOPE_VARIABLES = True  # False: render with every variable of the host (the unit tests compare)

    def _scoped_templar(self, options: dict, task_vars: dict) -> Any:
        """The task's templar, with the variables this role's checks can reach (module docstring)."""
        if not self.SCOPE_VARIABLES:
            return self._templar
        roots = words(self._task.args.get("rules"), set(options) | set(self._task.args.get("uniform") or []))
        scope = reachable(roots, task_vars)
        if scope is None:
            return self._templar
        return self._templar.copy_with_new_env(available_variables={n: task_vars[n] for n in scope})

    # ---- the three steps -----------------------------------------------------------------------
    def _check_spec(
        self, options: dict, task_vars: dict, defaults: dict, conditional: set[str]
    ) -> tuple[list[str], set[str]]:
        problems: list[str] = []
        bad: set[str] = set(self.carried_bad)
        self.derived: set[str] = set()
        self.rendered: dict[str, Any] = {}
        for name, spec in options.items():
            state, value = self._value(name, task_vars, defaults)
            if state == "unset":
                if spec.get("required"):
                    problems.append(f"{name} is not set: {hint(spec)}")
                    bad.add(name)
                continue
            if state == "later":
                bad.add(name)  # unknown yet: rules about it wait for the role's own run
                continue
            if state == "error":
                problems.append(value)
                bad.add(name)
                continue
            self.rendered[name] = value
            if self._derived(name, task_vars, defaults):
                self.derived.add(name)
                # the role's default, computed from another variable (e.g. sparkfleet_pins): the owner of that
                # variable reports a bad value; rules about this one are skipped when it is bad
                if placeholders(name, value) or (value is not None and type_problem(name, value, spec)):
                    bad.add(name)
                elif names_any(str(defaults[name]), self.carried_bad):
                    bad.add(name)  # computed from a variable an earlier role refused: its value means nothing
                continue
            # nested values and values that only matter sometimes (a rule with `when`): their rules say
            held = placeholders(name, value) if isinstance(value, str) and name not in conditional else []
            if held:
                problems += [
                    f"{p}='{PLACEHOLDER}' is the sample inventory's placeholder: {hint(spec)}" for p in held
                ]
                bad.add(name)
                continue
            if value is None and not spec.get("required"):
                continue
            problem = type_problem(name, value, spec)
            if problem:
                problems.append(problem)
                bad.add(name)
        return problems, bad

    def _uniform_values(self, names: list[str], task_vars: dict, bad: set[str]) -> dict[str, Any]:
        """This node's values of the variables that must be equal on every node; preflight's verdict
        compares them across the nodes (a host_vars override that makes one node differ is refused)."""
        values: dict[str, Any] = {}
        for name in names:
            if name in bad or name not in task_vars:
                continue
            if name in self.rendered:  # an option: the spec step rendered it already
                values[name] = self.rendered[name]
                continue
            try:
                values[name] = self._t.template(task_vars[name])
            except AnsibleError:
                continue
        return values

    def _kind_rule(self, rule: dict, names: list[str], hints: dict) -> list[str]:
        """A value's format or range: `{var: X, kind: port}`, `{var: X, min: 1, max: 300, fix: ...}`."""
        out = []
        rule = {
            **rule,
            **self._t.template({k: rule[k] for k in ("min", "max", "pattern", "fix") if k in rule}),
        }
        for bound in ("min", "max"):
            if isinstance(rule.get(bound), str) and as_int(rule[bound]) is not None:
                rule[bound] = as_int(rule[bound])
        for name in names:
            try:
                value = self._t.resolve_variable_expression(name)
            except AnsibleUndefinedVariable:
                continue  # unset: the spec says whether that is allowed
            if value is None and rule.get("optional", True):
                continue
            if isinstance(value, str) and value.strip() == PLACEHOLDER:
                fix = rule.get("fix") or hints.get(name.split(".")[0].split("[")[0], "")
                out.append(f"{name}='{PLACEHOLDER}' is the sample inventory's placeholder: {fix}")
                continue
            want = check_kind(value, rule)
            if want:
                fix = rule.get("fix") or hints.get(name.split(".")[0].split("[")[0], "")
                out.append(f"{name}={show(value)}: expected {want}" + (f"; {fix}" if fix else ""))
        return out

    def _check_rules(self, rules: list, bad: set[str], hints: dict | None = None) -> list[str]:
        problems: list[str] = []
        self.warnings_found: list[str] = []
        for index, rule in enumerate(rules or []):
            if not isinstance(rule, dict):
                raise AnsibleError(f"sparkfleet.cluster.validate: rules[{index}] is not a mapping")
            names = rule.get("var") or []
            names = [names] if isinstance(names, str) else list(names)
            if bad & set(names):
                continue
            if names and set(names) <= self.derived:
                continue  # computed from another variable, whose own rules speak for it
            if any(self._from_bad(name, bad) for name in names):
                continue  # written as a template of a variable already refused: that one is named, not this
            try:
                whens = rule.get("when")
                whens = [] if whens is None else [whens] if not isinstance(whens, list) else whens
                if not all(self._t.evaluate_conditional(conditional=w) for w in whens):
                    continue
                if "kind" in rule or "min" in rule or "max" in rule:
                    found = self._kind_rule(rule, names, hints or {})
                    problems += found
                    bad |= set(names) if found else set()
                    continue
                if "problems" in rule or "warnings" in rule:
                    found = [str(p) for p in self._t.template(rule.get("problems")) or []]
                    self.warnings_found += [str(w) for w in self._t.template(rule.get("warnings")) or []]
                    problems += found
                    bad |= set(names) if found else set()
                    continue
                thats = rule.get("that")
                thats = [thats] if isinstance(thats, str) else list(thats or [])
                if all(self._t.evaluate_conditional(conditional=t) for t in thats):
                    continue
                problems.append(str(self._t.template(rule.get("msg") or f"rule {index} failed: {thats}")))
                bad |= set(names)
            except AnsibleError as exc:
                first = exc.message.splitlines()[0]
                msg = rule.get("msg")
                try:
                    shown = str(self._t.template(msg)) if msg else f"rules[{index}]"
                except AnsibleError:
                    shown = f"{', '.join(names) or f'rules[{index}]'}: {msg}"
                problems.append(f"{shown} (the check could not be evaluated: {first})")
                bad |= set(names)
        return problems

    def _check_role(
        self, role: str, options: dict, defaults: dict, args: dict, values: Any
    ) -> tuple[list[str], list[str], dict[str, Any]]:
        """One role's problems, warnings and uniform values, with `values` as its variables."""
        rules = list(args.get("rules") or [])
        conditional = {
            n
            for r in rules
            if isinstance(r, dict) and r.get("when") is not None
            for n in ([r["var"]] if isinstance(r.get("var"), str) else list(r.get("var") or []))
        }
        self.raw_values = values
        problems, bad = self._check_spec(options, values, defaults, conditional)
        if self.rendered:
            # the rules read the options as just rendered: a value written as a template (a role default
            # such as "{{ sparkfleet_state_dir }}/clocks") is not compiled and rendered again by each rule
            known = {**self._t.available_variables, **self.rendered}
            self._t = self._t.copy_with_new_env(available_variables=known)
        uniform = self._uniform_values(list(args.get("uniform") or []), values, bad)
        hints = {name: hint(spec) for name, spec in options.items()}
        problems += self._check_rules(rules, bad, hints)
        self.carried_bad = bad
        return problems, list(self.warnings_found), uniform

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        if self._task.args.get("reset"):
            # preflight starts each run's verdict empty (facts of a task other than set_fact are host
            # facts: they would otherwise carry the last run's problems over, through the fact cache)
            empty = {
                "sparkfleet_validation_problems": [],
                "sparkfleet_validation_warnings": [],
                "sparkfleet_validation_values": {},
                "sparkfleet_validation_refused": [],
            }
            result.update(changed=False, ansible_facts=empty, msg="verdict reset")
            return result
        role, options, defaults = self._role_files()
        self._t = self._scoped_templar(options, task_vars)
        collect = self._task.args.get("collect")
        if collect is None:
            collect = task_vars.get("sparkfleet_validate_collect", False)
        # preflight layer 1 checks the roles one after the other: a rule about a variable an earlier role
        # refused is skipped (that role named it); a role's own run starts clean
        # the verdict so far: host facts (this action's ansible_facts), read where Ansible always puts them
        # (ansible_facts; top-level copies exist only with inject_facts_as_vars, which ansible.cfg turns off)
        verdict = task_vars.get("ansible_facts") or {}
        self.carried_bad = set(verdict.get("sparkfleet_validation_refused") or []) if collect else set()
        problems, warnings, uniform = self._check_role(role, options, defaults, self._task.args, task_vars)
        result.update(changed=False, problems=problems, role=role)
        if collect:
            known = list(verdict.get("sparkfleet_validation_problems") or [])
            entries = [{"role": role, "msg": p} for p in problems]
            seen = list(verdict.get("sparkfleet_validation_warnings") or [])
            values = dict(verdict.get("sparkfleet_validation_values") or {})
            values.update({name: {"role": role, "value": v} for name, v in uniform.items()})
            result["ansible_facts"] = {
                "sparkfleet_validation_problems": known + entries,
                "sparkfleet_validation_warnings": seen + [{"role": role, "msg": w} for w in warnings],
                "sparkfleet_validation_values": values,
                "sparkfleet_validation_refused": sorted(self.carried_bad),
            }
            result["msg"] = f"{role}: {len(problems)} problem(s) recorded"
            return result
        if problems:
            result["failed"] = True
            result["msg"] = [f"{role}: {len(problems)} input problem(s); nothing was changed:", *problems]
        else:
            result["msg"] = f"{role}: inputs OK"
        if warnings:
            result["warnings"] = warnings
        return result

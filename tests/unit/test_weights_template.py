"""The chat template fix: applied once, idempotent, a clear error on a template it does not fit."""
# ruff: noqa: S701, S106 - rendering a chat template to text, not HTML; bos_token is not a secret

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from sparkfleet_lab.hub.models import CHAT_TEMPLATE
from test_weights_support import ROLE, load_module

tmpl = load_module("weights_template")
PATCH = (ROLE / "files" / "chat_template-thinking-off.patch").read_text()


def run(tmp_path: Path, source: str, check: bool = False):
    src = tmp_path / "chat_template.jinja"
    src.write_text(source)
    return tmpl.run(
        {"src": str(src), "patch": PATCH, "dest": str(tmp_path / "out" / "chat_template.jinja")}, check
    )


def render(text: str, **kw) -> str:
    return (
        jinja2.Environment()
        .from_string(text)
        .render(
            messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True, bos_token="<s>", **kw
        )
    )


def test_the_fix_turns_thinking_off_by_default_and_on_on_request(tmp_path):
    out = run(tmp_path, CHAT_TEMPLATE)
    assert out["changed"] and out["state"] == "applied"
    fixed = (tmp_path / "out" / "chat_template.jinja").read_text()
    assert render(CHAT_TEMPLATE).endswith("<think>")  # the template as published thinks by default
    assert render(fixed).endswith("</think>")
    assert render(fixed, enable_thinking=True).endswith("<think>")
    assert render(fixed, reasoning_effort="high").endswith("<think>")
    assert render(fixed, reasoning_effort="none").endswith("</think>")
    assert render(fixed, enable_thinking=False, reasoning_effort="high").endswith("</think>")


def test_a_patch_without_its_final_newline_still_applies(tmp_path):
    src = tmp_path / "chat_template.jinja"
    src.write_text(CHAT_TEMPLATE)
    out = tmpl.run({"src": str(src), "patch": PATCH.rstrip(), "dest": str(tmp_path / "o.jinja")})
    assert out["state"] == "applied"


def test_second_run_changes_nothing(tmp_path):
    run(tmp_path, CHAT_TEMPLATE)
    assert not run(tmp_path, CHAT_TEMPLATE)["changed"]


def test_a_template_that_already_has_the_fix_is_served_as_is(tmp_path):
    run(tmp_path, CHAT_TEMPLATE)
    fixed = (tmp_path / "out" / "chat_template.jinja").read_text()
    other = tmp_path / "b"
    other.mkdir()
    out = run(other, fixed)
    assert out["state"] == "already in the template"
    assert (other / "out" / "chat_template.jinja").read_text() == fixed


def test_a_different_template_is_a_clear_error(tmp_path):
    with pytest.raises(tmpl.PatchError, match="not the one the fix was written for") as err:
        run(tmp_path, CHAT_TEMPLATE.replace("else true", "else maybe"))
    # it names the text the fix looks for, so the admin can see what the pinned template lacks
    assert "the template does not contain the text it fixes: " in str(err.value)
    assert "'{%- set thinking = enable_thinking if enable_thinking is defined else true -%}'" in str(
        err.value
    )
    assert not (tmp_path / "out").exists()


def test_a_snapshot_without_the_template_is_a_clear_error(tmp_path):
    with pytest.raises(tmpl.PatchError, match="the snapshot has no chat template") as err:
        tmpl.run({"src": str(tmp_path / "none.jinja"), "patch": PATCH, "dest": str(tmp_path / "out.jinja")})
    assert "model_weights_chat_template_patch to ''" in str(err.value)


def test_check_mode_writes_nothing_and_shows_the_diff(tmp_path):
    out = run(tmp_path, CHAT_TEMPLATE, check=True)
    assert out["changed"] and "reasoning_effort" in out["diff"]["after"]
    assert not (tmp_path / "out").exists()

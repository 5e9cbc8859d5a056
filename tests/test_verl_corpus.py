"""from-verl over a corpus of real verl launch scripts (tests/data/verl_corpus, MANIFEST.tsv gives each
one's repository, commit and path; two are tests/data/verl_scripts' seed scripts, not copied again): every shell script under verl's examples/ and verl-recipe that
starts a trainer, and scripts from public projects built on verl. Each is read as bash runs it
(with the stand-ins and placeholders of `verl_script`) and converted; the per-script table is
printed (`pytest -s`), and the totals are held: no script raises, every script's trainer call is
found and maps something, every Megatron script is read as Megatron, and the share of judged lines
mapped or inert does not fall below what it is today (the goal is 95 %)."""

from __future__ import annotations

import csv
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from grpo_config.from_verl import convert
from grpo_config.verl_script import ScriptError, read_trainer_call

CORPUS = Path(__file__).parent / "data" / "verl_corpus"
REFUSED_DOC = Path(__file__).resolve().parents[1] / "docs" / "VERL_REFUSED.md"
# Mapped or inert, of all judged lines over the corpus: measured 2026-12-07 (0.887, 211 scripts); goal 0.95.
MAPPED_OR_INERT_AT_LEAST = 0.887
_MEGATRON = re.compile(r"actor_rollout_ref\.actor\.megatron\.|--config-name[= ]['\"]?\w*megatron|strategy=megatron|model_engine=megatron")


@dataclass(frozen=True)
class Row:
    file: str
    lines: int
    mapped: int
    inert: int
    refused: int
    backend: str
    note: str
    refused_lines: list[tuple[str, str]] = field(default_factory=list)  # (override, reason)
    model: str = ""


def _manifest() -> list[dict[str, str]]:
    with (CORPUS / "MANIFEST.tsv").open(newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


# The scripts read the environment (`${MODEL_PATH:-...}`): the table is built in a fixed one, not in
# whatever the test session's other tests and the caller's shell left in os.environ.
_KEPT_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


@pytest.fixture(scope="module")
def table() -> list[Row]:
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n not in _KEPT_ENVIRONMENT]:
            env.delenv(name)
        return _build_table()


def _build_table() -> list[Row]:
    rows = []
    for entry in _manifest():
        path = CORPUS / entry["file"]
        try:
            call = read_trainer_call(path, env={}, timeout_s=30)
        except ScriptError as exc:
            rows.append(Row(entry["file"], 0, 0, 0, 0, "-", f"NOT FOUND: {exc}"))
            continue
        with capture_logs():
            conversion = convert(call.overrides, config_name=call.config_name)
        mapped = len(conversion.accepted) - len(conversion.inferred)
        notes = [n for n, on in (("static", call.static), ("placeholders", call.placeholders)) if on]
        rows.append(Row(entry["file"], len(call.overrides), mapped, len(conversion.inert), len(conversion.refused),
                        conversion.settings.get("actor", {}).get("backend", "torch"), ",".join(notes),
                        conversion.refused, str(conversion.settings.get("actor", {}).get("model_path", ""))))
    print(f"\n{'script':<90} {'lines':>5} {'mapped':>6} {'inert':>5} {'refused':>7} backend  notes")
    for r in rows:
        print(f"{r.file[-90:]:<90} {r.lines:>5} {r.mapped:>6} {r.inert:>5} {r.refused:>7} {r.backend:<8} {r.note}")
    return rows


def test_the_manifest_names_every_script_with_its_source() -> None:
    entries = _manifest()
    listed = [(CORPUS / e["file"]).resolve() for e in entries]  # the seed scripts of ../verl_scripts are not copied
    assert all(path.is_file() for path in listed) and len(set(listed)) == len(listed)
    assert {p.resolve() for p in CORPUS.rglob("*.sh")} <= set(listed)
    assert all(re.fullmatch(r"[0-9a-f]{40}", e["commit"]) and e["repository"] and e["path"] for e in entries)
    assert len({e["repository"] for e in entries}) >= 12 and len(entries) >= 200


def test_every_script_is_read_and_maps_something(table: list[Row]) -> None:
    assert [r.file for r in table if r.note.startswith("NOT FOUND")] == []
    assert [r.file for r in table if r.mapped == 0] == []


def test_every_megatron_script_is_read_as_megatron(table: list[Row]) -> None:
    megatron = {e["file"] for e in _manifest() if _MEGATRON.search((CORPUS / e["file"]).read_text(errors="replace"))}
    assert [r.file for r in table if r.file in megatron and r.backend != "megatron"] == []


def test_the_share_mapped_or_inert_holds(table: list[Row]) -> None:
    judged = sum(r.mapped + r.inert + r.refused for r in table)
    share = sum(r.mapped + r.inert for r in table) / judged
    print(f"\n{len(table)} scripts, {judged} judged lines: {share:.3f} mapped or inert")
    assert share >= MAPPED_OR_INERT_AT_LEAST


def _masked(text: str) -> str:
    """What changes from run to run as placeholders, for a stable document: temporary paths (the
    scratch directory, `mktemp`'s names) and digit runs (dates, times, ports the scripts make)."""
    text = re.sub(r"/tmp/[^\s,'\"]*", "<tmp path>", text)
    return re.sub(r"\d{4,}", "#", text).replace("|", "\\|").replace("\n", " ")


def render_refused_keys(table: list[Row]) -> str:
    """docs/VERL_REFUSED.md: every key refused over the corpus, with its count and reason."""
    lines: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # key -> (file, value, reason)
    for row in table:
        for override, reason in row.refused_lines:
            key, _, value = override.partition("=")
            value = value.strip()
            lines[key.strip().lstrip("+~")].append((row.file, value, reason.replace(value, "…") if value else reason))
    judged = sum(r.mapped + r.inert + r.refused for r in table)
    refused = sum(len(v) for v in lines.values())
    out = [
        "# verl keys grpo refuses, over the corpus",
        "",
        "GENERATED by `GRPO_WRITE_DOCS=1 hatch run pytest tests/test_verl_corpus.py` (the test fails when it",
        "is out of date). The corpus: tests/data/verl_corpus (MANIFEST.tsv names each script's repository and",
        "commit). Each key that `from-verl` refuses in at least one script, with the lines and scripts that",
        "give it, their values (temporary paths as <tmp path>, digit runs of 4 or more as #) and why it is",
        "refused (the value as …). The scripts run in a fixed environment (PATH, HOME, LANG).",
        "",
        f"{len(table)} scripts, {judged} judged lines, {refused} refused ({refused / judged:.1%}), {len(lines)} keys.",
        "",
        "| key | lines | scripts | values | why |",
        "|---|---:|---:|---|---|",
    ]
    for key, items in sorted(lines.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        values = Counter(_masked(v) for _, v, _ in items)
        reasons = Counter(_masked(r) for _, _, r in items)
        shown = sorted(values, key=lambda v: (-values[v], v))[:3]
        value_text = ", ".join(f"`{v}`" for v in shown) + (f" (+{len(values) - 3})" if len(values) > 3 else "")
        why = sorted(reasons, key=lambda r: (-reasons[r], r))
        why_text = " / ".join(why[:2]) + (f" (+{len(why) - 2} more)" if len(why) > 2 else "")
        out.append(f"| `{key}` | {len(items)} | {len({f for f, _, _ in items})} | {value_text} | {why_text} |")
    return "\n".join(out) + "\n"


def test_the_docs_list_every_refused_key_with_its_count_and_reason(table: list[Row]) -> None:
    text = render_refused_keys(table)
    if os.environ.get("GRPO_WRITE_DOCS") == "1":
        REFUSED_DOC.write_text(text)
    assert REFUSED_DOC.read_text() == text, (
        "docs/VERL_REFUSED.md is out of date: GRPO_WRITE_DOCS=1 hatch run pytest tests/test_verl_corpus.py"
    )


_QWEN_MOE = re.compile(r"Qwen3(?:\.5)?(?:-VL)?-[\d.]+B-A\d+B|Qwen3-Next")


def test_each_qwen_moe_megatron_script_launches_or_names_what_it_refuses(table: list[Row], tmp_path, monkeypatch, capsys) -> None:
    """`launch-35b --from-verl SCRIPT --dry-run --device gpu` (in-process, as test_launch_cli runs the
    launchers) over every Megatron script of the corpus whose model is a Qwen3 / Qwen3.5 MoE: the
    script's sizes over the 35B profile plan, or exit 2 with one line naming the settings refused."""
    import logging

    import structlog

    from grpo_launch_qwen35_35b import main

    scripts = [r.file for r in table if r.backend == "megatron" and _QWEN_MOE.search(r.model)]
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DEVICE", raising=False)
    handlers = list(logging.getLogger().handlers)
    outcomes = {}
    try:
        for file in scripts:
            code = main(["--from-verl", str(CORPUS / file), "--dry-run", "--device", "gpu", "--output-dir", str(tmp_path / "o")])
            err = capsys.readouterr().err
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            outcomes[file] = (code, errors)
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = handlers
    assert len(scripts) >= 18
    bad = {f: o for f, o in outcomes.items() if not (o[0] == 0 or (o[0] == 2 and len(o[1]) == 1))}
    assert bad == {}
    named = [e for code, (e,) in ((c, es) for c, es in outcomes.values() if c == 2) if "cannot be honoured" in e or "requires" in e]
    assert len(named) == sum(c == 2 for c, _ in outcomes.values())
    assert sum(c == 0 for c, _ in outcomes.values()) >= 2  # the two Qwen3.5 seed scripts

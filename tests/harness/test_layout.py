"""Tests mirror the code: every module of cluster/, jobs/, kernels/ and gateway/ has tests found by its
name, so a reader of `kernels/paged_mla/cache.py` finds `tests/kernels/paged_mla/test_paged_mla_cache.py`
without searching.

A module's tests are, in this order:
1. by name: a file in the mirrored folder `tests/<package>/<sub>/` (or the one above it) named
   `test_<module>[_topic].py` or `test_<sub>_<module>[_topic].py` (Liger-Kernel's one name across kernel
   and test: `kernels/measure/timing.py` -> `tests/kernels/measure/test_measure_timing.py`);
2. by its import name: test files that import it (`from jobs.judge.runs import ...`);
3. listed in ``EXERCISED_BY`` below, for a module only reached through another (a CLI verb through
   `jobs.cli.main`, a GPU-only profiling program): the test files that run it.

A new module with none of these fails here, naming the test file it should have.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "jobs", "kernels", "gateway", "schemakit")

EXERCISED_BY: dict[str, tuple[str, ...]] = {
    "jobs/cli/accept.py": ("tests/jobs/test_acceptance.py", "tests/jobs/test_tour_cpu.py"),
    "jobs/cli/db.py": ("tests/jobs/test_store_migrations.py",),
    "jobs/cli/jobs.py": ("tests/jobs/test_cli_output.py", "tests/jobs/test_exit_codes.py"),
    "jobs/cli/queue.py": ("tests/jobs/queue/test_queue_pool.py",),  # submit, pool serve, jobs cancel/wait
    "jobs/queue/notify.py": ("tests/jobs/queue/test_queue_pool.py",),  # the webhook, through a real pool
    "jobs/cli/sweep.py": ("tests/jobs/test_spec.py", "tests/jobs/test_scale.py"),
    "jobs/errors.py": ("tests/jobs/test_exit_codes.py",),
    "jobs/run/progress.py": ("tests/jobs/test_cli_output.py", "tests/e2e/test_readme_tour.py"),
    "jobs/run/verdict.py": ("tests/jobs/queue/test_queue_pool.py", "tests/jobs/test_exit_codes.py"),
    "jobs/spec/validation.py": ("tests/jobs/test_spec.py", "tests/jobs/test_cards.py"),
    # the store's parts: its tests run them through the package's public face, jobs.store
    "jobs/store/baseline_store.py": ("tests/jobs/test_baseline_safety.py",),
    "jobs/store/draft_store.py": ("tests/jobs/test_drafts_review.py", "tests/jobs/test_store_migrations.py"),
    "jobs/store/engine.py": ("tests/jobs/test_store_migrations.py", "tests/jobs/test_exit_codes.py"),
    "jobs/store/errors.py": ("tests/jobs/test_exit_codes.py", "tests/jobs/test_baseline_safety.py"),
    "jobs/store/finding_store.py": ("tests/jobs/test_store_judging.py", "tests/jobs/test_acceptance.py"),
    "jobs/store/records.py": ("tests/jobs/test_store_judging.py", "tests/jobs/test_drafts_review.py"),
    "jobs/store/page_reads.py": ("tests/jobs/test_site_incremental.py",),  # what a site rebuild reads
    "jobs/store/tables/base.py": ("tests/jobs/test_store_migrations.py",),  # every table against migrations
    "jobs/store/tables/baselines.py": ("tests/jobs/test_store_migrations.py",),
    "jobs/store/tables/drafts.py": ("tests/jobs/test_store_migrations.py",),
    "jobs/store/tables/findings.py": ("tests/jobs/test_store_migrations.py",),
    "jobs/store/tables/queue.py": ("tests/jobs/test_store_migrations.py", "tests/jobs/queue/test_queue.py"),
    "kernels/attention/profile.py": ("tests/kernels/attention/test_attention_gpu.py",),  # ncu, GPU only
    "kernels/fp8_gemm/profile_target.py": ("tests/kernels/fp8_gemm/test_fp8_gemm_gpu.py",),  # ncu, GPU only
    "kernels/measure/summary.py": (
        "tests/kernels/measure/test_measure_timing.py",
        "tests/jobs/test_noisy.py",
    ),
    "kernels/paged_mla/flash_mla_adapter.py": ("tests/kernels/paged_mla/test_paged_mla_case.py",),
    "kernels/paged_mla/trace_bench.py": ("tests/kernels/paged_mla/test_paged_mla_trace.py",),
    "gateway/http/services.py": ("tests/gateway/http/test_pipeline.py",),  # the bundle the app hands down
    "gateway/upstream/health.py": ("tests/gateway/upstream/test_routing_strategies.py",),  # via the router
    # the doctor's modules: test_doctor.py runs them through the package's public face, gateway.ops.doctor
    "gateway/ops/doctor/checks.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/inputs.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/key.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/probe.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/refusals.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/run.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/ops/doctor/settings.py": ("tests/gateway/ops/test_doctor.py",),
    "gateway/translate/api.py": ("tests/gateway/translate/test_translate.py",),
    "gateway/translate/chat.py": (
        "tests/gateway/translate/test_translate.py",
        "tests/gateway/translate/test_translate_stream.py",
    ),
    "gateway/translate/messages.py": ("tests/gateway/translate/test_translate.py",),
    "gateway/translate/responses.py": ("tests/gateway/translate/test_translate.py",),
}


def modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name in ("__init__.py", "__main__.py") or {"migrations", "__pycache__"} & set(rel.parts):
                continue
            found.append(rel)
    return found


def by_name(module: Path) -> list[Path]:
    sub = module.parent.name if len(module.parts) > 2 else ""
    prefixes = [f"test_{module.stem}"] + ([f"test_{sub}_{module.stem}"] if sub else [])
    mirrored = ROOT / "tests" / module.parent
    folders = [mirrored, mirrored.parent] if sub else [mirrored]
    return [
        f
        for folder in folders
        if folder.is_dir()
        for f in folder.glob("test_*.py")
        if any(f.stem == p or f.stem.startswith(p + "_") for p in prefixes)
    ]


def importers(module: Path, texts: dict[Path, str]) -> list[Path]:
    dotted = ".".join(module.with_suffix("").parts)
    parent, name = dotted.rsplit(".", 1)
    forms = (
        rf"from {re.escape(dotted)} import",
        rf"import {re.escape(dotted)}\b",
        rf"from {re.escape(parent)} import [^\n]*\b{name}\b",
    )
    uses = re.compile("|".join(forms))
    return [path for path, text in texts.items() if uses.search(text)]


def test_every_module_has_tests_found_by_its_name():
    texts = {p: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    lost = []
    for module in modules():
        if by_name(module) or importers(module, texts) or str(module) in EXERCISED_BY:
            continue
        sub = module.parent.name if len(module.parts) > 2 else module.parts[0]
        lost.append(
            f"{module}: no tests/{module.parent}/test_{sub}_{module.stem}.py (or test_{module.stem}.py)"
        )
    assert not lost, "modules without tests found by name:\n" + "\n".join(lost)


def test_the_listed_exceptions_are_real_and_still_needed():
    texts = {p: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    for module, tests in EXERCISED_BY.items():
        assert (ROOT / module).is_file(), f"{module} is gone: drop it from EXERCISED_BY"
        assert not by_name(Path(module)), f"{module} has tests by name now: drop it from EXERCISED_BY"
        assert not importers(Path(module), texts), f"{module} is imported by tests: drop it from EXERCISED_BY"
        for test in tests:
            assert (ROOT / test).is_file(), f"EXERCISED_BY[{module!r}] names {test}, which does not exist"


def test_no_family_dispatches_on_a_backend_name():
    """Issue 30: a backend declares what it runs and what it needs (kernels.base.Backend: impl, requires,
    config_keys); no `if backend == "sdpa"` chain decides it by name inside kernels/."""
    by_name = re.compile(r"""backend\s*[!=]=\s*["']""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "kernels").rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if by_name.search(line)]  # fmt: skip
    assert not found, found

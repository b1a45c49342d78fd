"""The peer arena's rows build and act on a tiny CogVideoX pipeline; the counter and the transfer protocol's
arithmetic are right. The numbers themselves are benchmarks (benchmarks/peers.py), not tests."""

import pytest
import torch

from benchmarks.peers_report import estimate, quality_markdown, speed_rows
from benchmarks.peers_rows import ROWS, Ctx, WorkCounter, calibrate_magcache, module_bytes
from benchmarks.peers_speed import DEFAULT_FAMILIES, family_row, resample
from sixbit.testing import COGVIDEOX_CALL, tiny_cogvideox_pipeline

STEPS = 4
LAYERS = 2
CALL = {**COGVIDEOX_CALL, "num_inference_steps": STEPS, "output_type": "latent"}
CPU_ROWS = [n for n, r in ROWS.items() if not r.gpu_only]


def _run(pipe):
    with WorkCounter(pipe.transformer) as wc:
        out = pipe("red circle", negative_prompt="", generator=torch.Generator().manual_seed(0), **CALL).frames
    return out, wc


@pytest.fixture(scope="module")
def baseline():
    torch.manual_seed(0)
    return _run(tiny_cogvideox_pipeline(num_layers=LAYERS))


def test_counter_counts_every_block_row_of_a_plain_run(baseline):
    _, wc = baseline
    assert wc.steps == [[2] * LAYERS] * STEPS  # CFG batched: 2 rows per block per step
    assert wc.fraction() == 1.0


def compiled(pipe, ctx=None):
    """A row part compiling every block with TorchDynamo's eager backend: the compile rows' code path (Dynamo's
    guards and recompiles) without inductor's C++ build."""
    for block in pipe.transformer.transformer_blocks:
        block.compile(backend="eager")
    return lambda: None


def _compiled_calls(pipe, calls: int = 3) -> tuple[list[int], list, WorkCounter]:
    """Frames TorchDynamo compiled in each of ``calls`` identical calls of ``pipe`` with :func:`compiled` blocks,
    the last call's output and counter."""
    from torch._dynamo.utils import counters

    compiled(pipe)
    frames = []
    for _ in range(calls):
        c = int(counters["frames"]["total"])
        out, wc = _run(pipe)
        frames.append(int(counters["frames"]["total"]) - c)
    return frames, out, wc


def test_counter_does_not_make_compiled_blocks_recompile(baseline):
    """The counter's counts are tensor data (buffers added to in place), so blocks compiled with it compile in the
    first call and never again — with every block computed, and under FirstBlockCache forced to skip (its hooks
    compile with the blocks; they add one variant in the second call, when their state first starts from a
    reset). A hook that counted in a Python list inside the compiled blocks makes Dynamo recompile until its
    recompile limit (session 17: which sent the blocks back to eager, and the compile rows timed eager)."""
    torch._dynamo.reset()
    try:
        frames, out, wc = _compiled_calls(tiny_cogvideox_pipeline(num_layers=LAYERS))
        assert frames[0] > 0 and frames[1:] == [0, 0]
        assert wc.steps == [[2] * LAYERS] * STEPS
        torch.testing.assert_close(out, baseline[0])

        torch._dynamo.reset()
        pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
        ROWS["fbc_0.1"].apply(pipe, Ctx(STEPS, torch.device("cpu"), mode="skip", num_blocks=LAYERS))
        frames, _, wc = _compiled_calls(pipe)
        assert frames[-1] == 0
        assert wc.steps == [[2] * LAYERS] + [[2] + [0] * (LAYERS - 1)] * (STEPS - 1)  # the head block computes

        torch._dynamo.reset()
        pipe, seen = tiny_cogvideox_pipeline(num_layers=LAYERS), []
        for block in pipe.transformer.transformer_blocks:
            block.attn1.to_out[0].register_forward_hook(lambda m, a, o: seen.append(len(seen) + a[0].shape[0]))
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), \
                pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            _compiled_calls(pipe)  # Python state in the graph: recompiles until Dynamo's limit
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("name", CPU_ROWS)
def test_row_builds_runs_and_acts(name, baseline):
    row = ROWS[name]
    ref, ref_wc = baseline
    mode = "skip" if row.caching else None
    pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    before = module_bytes(pipe.transformer)
    undo = row.apply(pipe, Ctx(STEPS, torch.device("cpu"), mode=mode, num_blocks=LAYERS))
    try:
        after = module_bytes(pipe.transformer)
        out, wc = _run(pipe)
    finally:
        undo()
    assert torch.isfinite(out).all()
    if row.caching:  # forced to skip what it can: fewer attention rows really computed than without it
        assert sum(map(sum, wc.steps)) < sum(map(sum, ref_wc.steps)), name
    if name == "baseline":
        assert torch.equal(out, ref)
    elif not row.caching:  # quantization: smaller weights, different numbers, every block computed
        assert after < before and not torch.equal(out, ref) and wc.fraction() == 1.0


#: caches whose documented knob is a schedule, not a threshold on the (random) model's features
RULE_BASED = ("taylorseer", "pab", "fastercache", "magcache")


@pytest.mark.parametrize("name", [n for n in CPU_ROWS if ROWS[n].family in RULE_BASED])
def test_caching_row_skips_at_its_own_setting(name):
    """At the documented setting (not forced), the schedule-driven caches skip something in 12 steps on the
    tiny model: their hooks found CogVideoX's blocks (TaylorSeer's default identifiers would not). MagCache
    with ratios of 1 accumulates no error, so it skips as often as max_skip_steps allows. Threshold-driven
    caches decide on random features here, so they are checked forced only (above)."""
    call = {**CALL, "num_inference_steps": 12}
    pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    ratios = [1.0] * 12 if ROWS[name].family == "magcache" else None
    undo = ROWS[name].apply(pipe, Ctx(12, torch.device("cpu"), mag_ratios=ratios, num_blocks=LAYERS))
    try:
        with WorkCounter(pipe.transformer) as wc:
            pipe("red circle", negative_prompt="", generator=torch.Generator().manual_seed(0), **call)
    finally:
        undo()
    assert wc.fraction() < 1.0, name


def test_fastercache_counts_half_batches():
    pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    undo = ROWS["fastercache_r2"].apply(pipe, Ctx(STEPS, torch.device("cpu"), num_blocks=LAYERS))
    try:
        _, wc = _run(pipe)
    finally:
        undo()
    assert any(c == 1 for s in wc.steps for c in s)  # the unconditional half skipped: one row computed


def test_magcache_calibration_returns_one_ratio_per_step():
    pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    ratios = calibrate_magcache(pipe, {**CALL, "prompt": "blue square", "negative_prompt": ""})
    assert len(ratios) == STEPS and ratios[0] == 1.0 and all(r > 0 for r in ratios)


def test_every_default_family_has_a_row():
    assert {family_row(f).family for f in DEFAULT_FAMILIES} == set(DEFAULT_FAMILIES)
    assert {r.family for r in ROWS.values()} <= set(DEFAULT_FAMILIES)


def test_resample_keeps_relative_position():
    assert resample([1.0, 0.0], 4) == [1.0, 1.0, 0.0, 0.0]
    assert resample([0.5] * 20, 50) == [0.5] * 50
    assert len(resample(list(range(50)), 20)) == 20


def test_transfer_protocol_arithmetic():
    fam = {"t_full_s": 1.0, "saving_per_unit_s": 0.01, "units_full": 60}
    est = estimate({"per_step_computed": [1.0, 0.5]}, fam, 4)
    assert est["step_s"] == pytest.approx([1.0, 1.0, 0.7, 0.7])
    q = {"rows": {"baseline": {"family": "baseline"}, "x": {"family": "fbc", "per_step_computed": [0.5]}}}
    sp = {"steps": 10, "models": {"2b": {"families": {
        "baseline": {"t_full_s": 1.0, "saving_per_unit_s": 0.0, "units_full": 60},
        "fbc": {"t_full_s": 1.1, "saving_per_unit_s": 0.01, "units_full": 60, "weight_bytes": 5}}}}}
    rows = speed_rows(q, sp)
    assert rows["x"]["speedup"] == pytest.approx(10.0 / (10 * (1.1 - 0.3)))
    assert rows["baseline"]["speedup"] == pytest.approx(1.0)
    # a sixbit row's warm-up steps (recorded in its schedule's config) cost the baseline's step, not its family's
    warm = {"per_step_computed": [1.0, 0.5], "schedule": {"source": {"config": {"warmup_steps": 1}}}}
    assert estimate(warm, fam, 4, t_warm=2.0)["step_s"] == pytest.approx([2.0, 1.0, 0.7, 0.7])
    assert estimate(warm, fam, 4)["step_s"] == pytest.approx([1.0, 1.0, 0.7, 0.7])
    q["rows"]["x"] |= {"schedule": {"source": {"config": {"warmup_steps": 2}}}}
    assert speed_rows(q, sp)["x"]["speedup"] == pytest.approx(10.0 / (2 * 1.0 + 8 * (1.1 - 0.3)))


def test_quality_markdown_names_rows_and_failures():
    stat = {"mean": 1.0, "std": 0.0, "n": 1}
    payload = {"generation": {"num_inference_steps": 2}, "prompts": ["p"], "seeds": [0], "counting": "c",
               "magcache_calibration": None, "environment": {"command": "cmd", "device": "cpu"},
               "rows": {"a": {"label": "A row", "n": 1, "weight_bytes": 2**20,
                              "summary": {m: stat for m in ("psnr", "ssim", "flow_error", "adherence",
                                                            "computed_fraction", "time_s")}},
                        "b": {"label": "B row", "n": 0, "error": "ImportError: no sageattention", "summary": {}}}}
    payload["rows"]["c"] = {"label": "C row", "n": 0, "gpu_only": True, "reason": "needs CUDA", "summary": {}}
    md = quality_markdown(payload)
    assert "| A row | 1 | 1.00 ± 0.00" in md and "cannot run: ImportError: no sageattention" in md and "`cmd`" in md
    assert "| C row | 0 | GPU only: needs CUDA |" in md


def test_gpu_only_rows_say_why_and_the_sixbit_group_expands():
    from benchmarks.peers import GROUPS, row_names

    assert all(r.reason for r in ROWS.values() if r.gpu_only) and ROWS["torchao_fp8_compile"].gpu_only
    names = row_names(["fbc_0.1", "sixbit", "sage"])
    assert names[:2] == ["baseline", "fbc_0.1"] and "sage" not in names
    assert names[2:] == GROUPS["sixbit"] and {"sixbit_full_w8a8", "sixbit_aggressive"} <= set(names)
    assert row_names(None)[0] == "baseline" and not any(ROWS[n].gpu_only for n in row_names(None))


def test_fresh_forgets_the_named_rows_but_never_the_reference(tmp_path):
    from benchmarks.peers import forget

    keep = ["baseline__0_0.json", "row__baseline.json", "ref__0_0.npy", "fbc_0.1__0_0.json", "sixbit_full_w8a8__0_0.json"]
    gone = ["sixbit_full__0_0.json", "sixbit_full__3_1.json", "row__sixbit_full.json", "schedule__sixbit_full.json"]
    for f in keep + gone:
        (tmp_path / f).write_text("{}")
    assert forget(tmp_path, ["baseline", "sixbit_full"]) == len(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


def test_quality_summary_uses_the_quality_benchmarks_prompts(tmp_path):
    """--summarize-only on an empty run dir: the prompts are `bench quality`'s (benchmarks.common.mini_setup),
    every CPU row is listed as not run and every GPU-only row with its reason."""
    import json

    from benchmarks.common import mini_setup
    from benchmarks.peers import main

    main(["quality", "--steps", "3", "--prompts", "2", "--seeds", "1", "--summarize-only", "--run-dir",
          str(tmp_path / "run"), "--out", str(tmp_path), "--name", "q"])
    res = json.loads((tmp_path / "q.json").read_text())
    _, gen, prompts = mini_setup(None, "cpu", 3, 12)
    assert res["prompts"] == prompts[:2] and res["generation"] == gen and res["seeds"] == [0]
    assert set(res["not_run"]) == set(CPU_ROWS)
    assert {n for n, r in res["rows"].items() if r.get("gpu_only")} == {n for n, r in ROWS.items() if r.gpu_only}
    assert "GPU only: SageAttention on the CPU" in (tmp_path / "q.md").read_text()
    res["rows"]["fbc_0.1"] = {"n": 24}  # a result file with a row this run dir has no videos of: kept
    (tmp_path / "q.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit, match="fbc_0.1"):
        main(["quality", "--steps", "3", "--prompts", "2", "--seeds", "1", "--summarize-only", "--run-dir",
              str(tmp_path / "run"), "--out", str(tmp_path), "--name", "q"])
    # --carry-missing keeps it as it was, marked with the file's date, and lists it in the markdown
    res["rows"]["fbc_0.1"] = {"name": "fbc_0.1", "label": "FBC 0.1", "n": 2, "command": "python -m old",
                              "summary": {m: {"mean": 40.0, "std": 1.0, "n": 2} for m in
                                          ("psnr", "ssim", "flow_error", "adherence", "computed_fraction", "time_s")}}
    (tmp_path / "q.json").write_text(json.dumps(res))
    main(["quality", "--steps", "3", "--prompts", "2", "--seeds", "1", "--summarize-only", "--carry-missing",
          "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path), "--name", "q"])
    again = json.loads((tmp_path / "q.json").read_text())
    assert again["rows"]["fbc_0.1"]["carried"] == res["environment"]["date"] and "fbc_0.1" not in again["not_run"]
    assert again["rows"]["fbc_0.1"]["summary"]["psnr"]["mean"] == 40.0 and "python -m old" in again["commands"]
    assert "(`--carry-missing`): fbc_0.1" in (tmp_path / "q.md").read_text()
    with pytest.raises(SystemExit, match="other prompts or seeds"):  # carried rows must be of the same videos
        main(["quality", "--steps", "3", "--prompts", "2", "--seeds", "2", "--summarize-only", "--carry-missing",
              "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path), "--name", "q"])


def test_goal_front_and_interpolation():
    from benchmarks.peers_goal import front, front_speedup, goal

    pts = [("baseline", float("inf"), 1.0, 10), ("a", 50.0, 1.5, 10), ("b", 40.0, 2.0, 10), ("slow", 35.0, 1.2, 5),
           ("c", 30.0, 3.0, 10)]
    fr = front(pts)
    assert [n for _, _, n in fr] == ["c", "b", "a", "baseline"]  # "slow" is dominated by b
    assert front_speedup(fr, 45.0) == (pytest.approx(1.75), "b–a")
    assert front_speedup(fr, 20.0)[0] == 3.0 and front_speedup(fr, 60.0) == (1.0, "baseline")

    def row(psnr, n=1):
        return {"summary": {"psnr": {"mean": psnr, "n": n, "n_inf": 0 if n else 1}}}
    q = {"prompts": ["p"], "rows": {**{n: row(p, 0 if p == float("inf") else 1) for n, p, _, _ in pts},
                                    "sixbit_x": row(45.0), "sixbit_unfinished": row(60.0, 0) | {"summary": {}}}}
    est = {n: {"speedup": s, "weight_bytes": w} for n, _, s, w in pts} | {"sixbit_x": {"speedup": 2.1, "weight_bytes": 2}}
    est["sixbit_unfinished"] = {"speedup": 9.0, "weight_bytes": 1}
    assert set(goal(q, est)["rows"]) == {"sixbit_x"}  # a row with no video on some prompt takes no part
    g = goal(q, est)["rows"]["sixbit_x"]
    assert g["speed_ratio"] == pytest.approx(2.1 / 1.75) and g["peer_weight_row"] == "c"  # only c is ≥ 2.1×
    assert g["memory_ratio"] == 5.0
    # the memory row: the smallest weights; two rows that small -> the one with the better ratio (the faster one)
    q["rows"] |= {"sixbit_small_slow": row(45.0), "sixbit_small_fast": row(40.0)}
    est |= {"sixbit_small_slow": {"speedup": 1.1, "weight_bytes": 1}, "sixbit_small_fast": {"speedup": 2.5, "weight_bytes": 1}}
    g = goal(q, est)
    assert g["rows"]["sixbit_small_slow"]["memory_ratio"] == 5.0  # "slow" (1.2×, 5 bytes) is as fast as it
    assert g["memory"] == "sixbit_small_fast" and g["rows"]["sixbit_small_fast"]["memory_ratio"] == 10.0  # only c


def test_speed_runs_merge_newest_entry_against_its_own_baseline():
    from benchmarks.peers_report import merge_speed

    def run(date, fams, file):
        return {"file": file, "steps": 10, "protocol": "p", "environment": {"date": date, "command": file},
                "models": {"2b": {"families": fams}}}
    unit = {"saving_per_unit_s": 0.0, "units_full": 60}
    old = run("2026-01-01", {"baseline": {"t_full_s": 1.0, **unit}, "fbc": {"t_full_s": 1.0, **unit},
                             "sage": {"t_full_s": 0.5, **unit}}, "old.json")
    new = run("2026-01-02", {"baseline": {"t_full_s": 2.0, **unit}, "fbc": {"t_full_s": 1.0, **unit},
                             "sage": {"error": "no GPU"}}, "new.json")
    sp = merge_speed([new, old])
    assert sp["models"]["2b"]["families"]["sage"]["source"] == "old.json"  # an error never replaces a result
    q = {"rows": {"baseline": {"family": "baseline"}, "fbc_0.1": {"family": "fbc", "per_step_computed": [1.0]}}}
    rows = speed_rows(q, sp)
    assert rows["fbc_0.1"]["speedup"] == pytest.approx(2.0)  # against new.json's baseline, which timed it
    assert rows["sage"]["speedup"] == pytest.approx(2.0)  # old.json's sage against old.json's baseline


def test_speed_runs_at_another_step_count_resolve_that_counts_tables():
    """A speed run at 20 steps (sixbit's families resolve for 20 steps) feeds the 20-step quality table only;
    the 50-step run stays primary and feeds the others; neither is refused."""
    from benchmarks.peers_report import merge_speed

    unit = {"saving_per_unit_s": 0.0, "units_full": 60}

    def run(date, steps, t_six, file):
        return {"file": file, "steps": steps, "protocol": "p", "environment": {"date": date, "command": file},
                "models": {"2b": {"families": {"baseline": {"t_full_s": 1.0, **unit},
                                               "sixbit_x": {"t_full_s": t_six, **unit}}}}}
    sp = merge_speed([run("2026-01-02", 20, 0.25, "s20.json"), run("2026-01-01", 50, 0.5, "s50.json")])
    assert sp["steps"] == 50 and sp["models"]["2b"]["families"]["sixbit_x"]["source"] == "s50.json"
    assert [s["steps"] for s in sp["sources"]] == [50, 20]

    def q(steps):
        return {"generation": {"num_inference_steps": steps},
                "rows": {"x": {"family": "sixbit_x", "per_step_computed": [1.0] * steps}}}
    assert speed_rows(q(20), sp)["x"]["speedup"] == pytest.approx(4.0)
    assert speed_rows(q(50), sp)["x"]["speedup"] == pytest.approx(2.0)
    assert speed_rows(q(30), sp)["x"]["speedup"] == pytest.approx(2.0)  # no run at 30: the primary one


def test_sixbit_forced_modes_replay_schedules():
    """The GPU half's sixbit modes: all computed with the routes recorded on another model (resampled to this
    depth and step count), or all skipped after the first step."""
    import sixbit

    rec_pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    handle = sixbit.apply(rec_pipe, sixbit.SixBitConfig.preset("full"))
    try:
        _run(rec_pipe)
        recorded = handle.trace.skip_schedule().to_dict()
    finally:
        handle.remove()
    assert recorded.get("routes")
    for mode, expect in (("compute", 1.0), ("skip", 1.0 / STEPS)):
        pipe = tiny_cogvideox_pipeline(num_layers=LAYERS + 1)
        undo = ROWS["sixbit_full"].apply(pipe, Ctx(STEPS, torch.device("cpu"), mode=mode, schedule=recorded,
                                                   num_blocks=LAYERS + 1))
        try:
            _, wc = _run(pipe)
            modes = {b["mode"] for st in pipe._peers_sixbit.trace.steps for br in st.branches.values()
                     for b in br.blocks if b}
        finally:
            undo()
        assert wc.fraction() == pytest.approx(expect), mode
        assert ("replay" in modes) == (mode == "compute"), modes


def test_sixbit_forced_modes_resolve_the_step_count_options_for_the_estimated_loop():
    """A speed mode times a few steps for a 50-step loop: ``tdc_reuse="auto"`` takes the 50-step loop's forecast
    (its memory and skip cost are what the estimate needs), not the timed steps' plain reuse."""
    for loop, expect in ((50, "quadratic"), (20, "magnitude"), (None, "auto")):
        pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
        undo = ROWS["sixbit_tdc_only"].apply(pipe, Ctx(STEPS, torch.device("cpu"), mode="skip", num_blocks=LAYERS,
                                                       loop_steps=loop))
        try:
            assert pipe._peers_sixbit.cfg.tdc_reuse == expect
            _, wc = _run(pipe)
        finally:
            undo()
        assert wc.fraction() == pytest.approx(1.0 / STEPS)


def test_torchao_rows_can_leave_the_modulation_linears_in_16_bits():
    """The compiled int8 row keeps the blocks' 2-row modulation linears unquantized (compiled, cuBLAS int8
    refuses them) and quantizes every other linear, as the eager row does."""
    from benchmarks.peers_rows import MODULATION, torchao_quant

    kinds = {}
    for modulation in (True, False):
        pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
        torchao_quant("int8", modulation=modulation)(pipe, Ctx(STEPS, torch.device("cpu")))
        kinds[modulation] = {n: type(m.weight) is not torch.nn.Parameter and type(m.weight) is not torch.Tensor
                             for n, m in pipe.transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    mod = [n for n in kinds[True] if n.endswith(MODULATION)]
    assert len(mod) == 2 * LAYERS and all(kinds[True].values())
    assert not any(kinds[False][n] for n in mod)
    assert all(q for n, q in kinds[False].items() if n not in mod)


def test_speed_half_smoke_on_a_tiny_pipeline(tmp_path):
    """The GPU half's code path on the CPU: forced modes, warm-up + timed calls, counts, result files."""
    import json

    from benchmarks.peers import main

    main(["speed", "--sizes", "tiny", "--device", "cpu", "--families", "baseline", "fbc", "--timed-steps", "3",
          "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path), "--name", "smoke"])
    res = json.loads((tmp_path / "smoke.json").read_text())
    fams = res["models"]["tiny"]["families"]
    assert fams["baseline"]["units_full"] == 6 and "t_skip_s" not in fams["baseline"]
    assert fams["fbc"]["units_skip"] == 2 < fams["fbc"]["units_full"] == 6  # only the first block computed
    assert len(fams["fbc"]["modes"]["skip"]["step_s"]) == 3 and res["protocol"]
    assert "| fbc (fbc_0.05) |" in (tmp_path / "smoke.md").read_text()


def test_speed_half_compiles_in_the_warm_up_never_in_the_timed_call(tmp_path, monkeypatch):
    """A compiled row (here: every block compiled with TorchDynamo's eager backend, the torchao compile rows'
    code path without inductor's cost) compiles in the untimed warm-up call; the timed call compiles nothing,
    and both facts are in the result file."""
    import json

    from benchmarks import peers_speed
    from benchmarks.peers import main
    from benchmarks.peers_rows import Row

    torch._dynamo.reset()
    monkeypatch.setattr(peers_speed, "family_row", lambda f: Row("compiled", f, "compiled blocks", compiled, caching=False))
    main(["speed", "--sizes", "tiny", "--device", "cpu", "--families", "torchao_fp8_compile", "--timed-steps", "2",
          "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path), "--name", "c"])
    fam = json.loads((tmp_path / "c.json").read_text())["models"]["tiny"]["families"]["torchao_fp8_compile"]
    assert fam["compiles_warmup"] >= 1 and fam["compiles_timed"] == 0 and fam["warmup_s"] > 0
    assert f"| {fam['compiles_warmup']} / 0 |" in (tmp_path / "c.md").read_text()
    assert fam["modes"]["None"]["warmup_calls"] == 2  # the call that compiled, then one that compiled nothing


def test_speed_half_times_a_compiled_cache_without_compiling_and_fails_a_row_that_would_run_eager(tmp_path,
                                                                                                  monkeypatch):
    """FirstBlockCache under torch.compile (the fp8 + compile stack's code path, eager backend): both forced
    modes warm up until a call compiles nothing, then time without a compile, and the skip mode's timed steps
    compute only the head block. A row whose compiled blocks keep recompiling (Python state in the graph) hits
    Dynamo's recompile limit: the row fails with that reason instead of timing eager code."""
    import json

    from benchmarks import peers_speed
    from benchmarks.peers import main
    from benchmarks.peers_rows import Row, fbc, stack


    def recompiling(pipe, ctx):
        seen = []
        for block in pipe.transformer.transformer_blocks:
            block.attn1.to_out[0].register_forward_hook(lambda m, a, o: seen.append(len(seen)))
        return compiled(pipe, ctx)
    rows = {"stack_fbc_fp8_compile": Row("fbc_compiled", "stack_fbc_fp8_compile", "fbc + compiled blocks",
                                         stack(fbc(0.1), compiled)),
            "torchao_fp8_compile": Row("recompiling", "torchao_fp8_compile", "recompiling", recompiling, caching=False)}
    monkeypatch.setattr(peers_speed, "family_row", rows.get)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 4)
    torch._dynamo.reset()
    try:
        main(["speed", "--sizes", "tiny", "--device", "cpu", "--families", "stack_fbc_fp8_compile",
              "torchao_fp8_compile", "--timed-steps", "6", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path),
              "--name", "c"])
    finally:
        torch._dynamo.reset()
    fams = json.loads((tmp_path / "c.json").read_text())["models"]["tiny"]["families"]
    fam = fams["stack_fbc_fp8_compile"]
    assert fam["compiles_warmup"] >= 1 and fam["compiles_timed"] == 0
    assert all(m["warmup_calls"] >= 2 for m in fam["modes"].values())
    assert (fam["units_full"], fam["units_skip"]) == (2 * 3, 2)  # tiny: 3 blocks; skipped: the head block's 2 rows
    assert "recompile" in fams["torchao_fp8_compile"]["error"].lower()


def test_goal_verdicts_say_by_how_much():
    from benchmarks.peers_goal import both, verdict

    assert verdict(1.10, 1.2) == "**missed** (−0.10× against 1.2×: −8 %)"
    assert verdict(3.32, 3.0) == "**met** (+0.32× against 3×: +11 %)"
    rows = {"a": {"speed_ratio": 1.3, "memory_ratio": 2.0}, "b": {"speed_ratio": 1.2, "memory_ratio": 3.1}}
    assert both({"rows": rows}) == "`b`" and both({"rows": {"a": rows["a"]}}) == "none"


@pytest.mark.parametrize("size,params,blocks", [("2b", 1.69e9, 30), ("5b", 5.57e9, 42)])
def test_speed_sizes_are_the_real_cogvideox_transformers(size, params, blocks):
    """`speed --sizes 2b 5b` builds these (on the meta device here: no memory)."""
    from diffusers import CogVideoXTransformer3DModel

    from benchmarks.common import SIZES

    with torch.device("meta"):
        tr = CogVideoXTransformer3DModel(**SIZES[size])
    assert sum(p.numel() for p in tr.parameters()) == pytest.approx(params, rel=0.01)
    assert len(tr.transformer_blocks) == blocks


def test_report_adds_gpu_only_rows_a_quality_table_predates():
    """A quality table from before a GPU-only row existed still lists it (no videos, its reason), in row order."""
    from benchmarks.peers_report import with_gpu_only_rows

    rows = with_gpu_only_rows({"baseline": {"name": "baseline"}, "sixbit_full": {"name": "sixbit_full"}})
    assert rows["stack_fbc_fp8_compile"]["gpu_only"] and rows["stack_fbc_fp8_compile"]["reason"]
    names = list(rows)
    assert names[0] == "baseline" and names.index("stack_fbc_fp8_compile") < names.index("sixbit_full")
    assert rows["sixbit_full"] == {"name": "sixbit_full"}


def test_gpu_speed_rows_carry_the_quality_of_the_cpu_row_with_their_numbers():
    """torchao_fp8_compile / stack_fbc_fp8_compile (GPU speed rows) take the mini quality and work pattern of
    torchao_fp8 / stack_fbc_fp8 when the table has them, marked as borrowed, and join the goal's peer front;
    without their source they stay GPU-only rows with a reason."""
    from benchmarks.peers_goal import _points, front
    from benchmarks.peers_report import with_gpu_only_rows

    stats = {m: {"mean": v, "std": 0.0, "n": 2} for m, v in
             (("psnr", 40.0), ("ssim", 0.99), ("flow_error", 0.1), ("adherence", 90.0), ("computed_fraction", 0.5),
              ("time_s", 1.0))}
    src = {"name": "stack_fbc_fp8", "label": "FBC + fp8", "family": "stack_fbc_fp8", "n": 2, "summary": stats,
           "per_step_computed": [1.0, 0.5, 0.5, 1.0]}
    base = {"name": "baseline", "label": "baseline", "family": "baseline", "n": 0,
            "summary": {**stats, "psnr": {"n": 0, "n_inf": 2}}, "per_step_computed": [1.0] * 4}
    rows = with_gpu_only_rows({"baseline": base, "stack_fbc_fp8": src})
    got = rows["stack_fbc_fp8_compile"]
    assert got["quality_of"] == "stack_fbc_fp8" and got["gpu_only"] and got["family"] == "stack_fbc_fp8_compile"
    assert got["summary"] == stats and got["per_step_computed"] == src["per_step_computed"] and got["n"] == 2
    assert "stack_fbc_fp8's" in got["label"] and "quality_of" not in rows["torchao_fp8_compile"]
    assert rows["torchao_fp8_compile"]["n"] == 0 and rows["torchao_fp8_compile"]["reason"]
    payload = {"generation": {"num_inference_steps": 4}, "prompts": ["a", "b"], "seeds": [0], "counting": "c",
               "magcache_calibration": None, "environment": {"command": "cmd"}, "rows": rows}
    assert "| FirstBlockCache 0.1 + torchao fp8 dynamic + torch.compile of each block (quality: stack_fbc_fp8's) | 2 | " \
           "40.00 ± 0.00" in quality_markdown(payload)

    fam = {"t_full_s": 1.0, "saving_per_unit_s": 0.01, "units_full": 60}
    speed = {"steps": 4, "models": {"2b": {"families": {"baseline": fam, "stack_fbc_fp8": fam,
                                                        "stack_fbc_fp8_compile": {**fam, "t_full_s": 0.5}}}}}
    est = speed_rows({"rows": rows}, speed)
    assert est["stack_fbc_fp8_compile"]["speedup"] > est["stack_fbc_fp8"]["speedup"] > 1.0
    fr = [n for _, _, n in front(_points({"prompts": ["a", "b"], "rows": rows}, est))]
    assert fr == ["stack_fbc_fp8_compile", "baseline"]  # as good as stack_fbc_fp8 and faster


def test_fp8_rows_lift_torchao_s_cuda_check_for_their_quantize_call_only():
    """On the CPU torchao's fp8 config refuses to quantize; the fp8 rows lift that one check while they call
    quantize_ (its Float8Tensor weights, e4m3 with per-row scales), and torchao refuses again afterwards."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    from torchao.quantization.quantize_.workflows import Float8Tensor

    from benchmarks.peers_rows import torchao_quant

    def refuses():
        with pytest.raises(AssertionError, match="compute capability"):
            quantize_(torch.nn.Sequential(torch.nn.Linear(32, 16)),
                      Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))

    refuses()
    pipe = tiny_cogvideox_pipeline(num_layers=LAYERS)
    torchao_quant("fp8")(pipe, Ctx(STEPS, torch.device("cpu")))
    linears = [m for m in pipe.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m.weight, Float8Tensor) for m in linears)
    w = linears[0].weight
    assert w.qdata.dtype == torch.float8_e4m3fn and w.scale.shape[0] == w.shape[0]  # one scale per output row
    refuses()

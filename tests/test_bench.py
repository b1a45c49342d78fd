"""Smoke tests of ``python -m benchmarks``: the quality, speed, weights and memory benchmarks run end to end
on the CPU at toy sizes and write a JSON file and a markdown table whose numbers are consistent with each
other. (The numbers in benchmarks/results/ come from the same code at real sizes; speed is never asserted
here.)"""

from __future__ import annotations

import json
import math

import pytest
import torch

import sixbit_kernels as sk
from benchmarks import __main__ as cli
from benchmarks import (
    attention_accuracy,
    attention_heads,
    common,
    memory,
    mode_flip,
    paired,
    quality,
    speed,
    weights,
)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


def test_quality_smoke_on_sixbit_mini(out, one_thread):
    quality.main(["--prompts", "1", "--seeds", "1", "--steps", "6", "--configs", "fp16", "w4a4", "full",
                "dmpq_tdc", "full_same_skips", "--pdr-rho", "0", "--tdc-threshold", "10", "--tdc-budget", "10",
                  "--warmup-steps", "0",
                "--out", str(out), "--name", "q"])
    data = json.loads((out / "q.json").read_text())
    md = (out / "q.md").read_text()
    rows = ("fp16", "w4a4", "full", "dmpq_tdc", "full_same_skips")
    assert set(data["summary"]) == set(rows)
    assert [len(data["runs"][c]) for c in rows] == [1] * 5
    # full_same_skips replays dmpq_tdc's skips exactly (its own TDC would skip differently: PDR is on)
    same, src = data["runs"]["full_same_skips"][0], data["runs"]["dmpq_tdc"][0]
    assert 0 < same["skip_fraction"] == src["skip_fraction"] and same["pdr_count"] > 0 == src["pdr_count"]
    # the reference compared with itself is identical; the all-NVFP4 run is not, and reports 4.5 bits
    assert math.isinf(data["runs"]["fp16"][0]["psnr"]) and data["summary"]["fp16"]["psnr"]["n"] == 0
    w4 = data["summary"]["w4a4"]
    assert 10 < w4["psnr"]["mean"] < 80 and 0 < w4["ssim"]["mean"] < 1
    assert w4["avg_act_bits"]["mean"] == pytest.approx(4.5)
    assert 0 <= data["summary"]["full"]["skip_fraction"]["mean"] < 1
    for c in ("fp16", "w4a4", "full"):
        assert 0 <= data["summary"][c]["adherence"]["mean"] <= 100
    for label in ("FP16/FP32 (reference)", "static W4A4 (all NVFP4)", "full 6Bit (DMPQ+TDC+PDR) + 8-bit attention by policy"):
        assert f"| {label} |" in md
    assert (out / "q_schedule.json").exists()  # the full method's skip pattern, for the speed benchmark
    # the judge's reading against FP32's: a column, a 0/1 flag per quantized video, none for the reference
    assert "| judge ≠ FP32 |" in md and "judge_changed" not in data["runs"]["fp16"][0]
    flag = data["runs"]["w4a4"][0]["judge_changed"]
    assert flag in (0.0, 1.0) and f"| {int(flag)} / 1 |" in md.split("static W4A4 (all NVFP4)")[1].split("\n")[0]
    # the full preset routes attention by the mini policy's fits (CPU: the emulation); the static row never
    assert data["summary"]["w4a4"]["attention_fp8"]["mean"] == 0 and "| 8-bit attention |" in md
    sched = json.loads((out / "q_schedule.json").read_text())
    assert sched["version"] == 3 and sched["attention_fp8_fraction"] == pytest.approx(
        data["runs"]["full"][0]["attention_fp8"])
    # --pdr-rho reaches the configurations with PDR only; PDR firings are a column
    assert data["pdr_overrides"] == {"pdr_rho": 0.0} and "PDR ρ override: 0.0" in md and "| PDR / run |" in md
    assert data["summary"]["w4a4"]["pdr_count"]["mean"] == 0 and data["summary"]["full"]["pdr_count"]["n"] == 1


def test_quality_warmup_steps_override_runs_the_first_steps_of_dmpq_rows_in_full_precision(out, one_thread):
    """--warmup-steps reaches the DMPQ rows: with every step a warm-up step nothing is quantized (16 bits, no
    8-bit attention); the static rows keep their routes; the override is in the JSON and the markdown."""
    quality.main(["--prompts", "1", "--seeds", "1", "--steps", "3", "--configs", "fp16", "w4a4", "dmpq_only",
                  "--warmup-steps", "3", "--out", str(out), "--name", "qw"])
    data, md = json.loads((out / "qw.json").read_text()), (out / "qw.md").read_text()
    dmpq = data["summary"]["dmpq_only"]
    assert dmpq["avg_act_bits"]["mean"] == 16 and dmpq["attention_fp8"]["mean"] == 0
    assert data["summary"]["w4a4"]["avg_act_bits"]["mean"] == pytest.approx(4.5)
    assert data["warmup_overrides"] == {"warmup_steps": 3} and "warm-up steps (DMPQ rows): 3" in md


def test_quality_records_the_schedule_of_the_row_it_is_told(out, one_thread):
    """--schedule-config: the schedule of another row (here 8-bit attention after every skip), for bench speed."""
    quality.main(["--prompts", "1", "--seeds", "1", "--steps", "6", "--configs", "fp16", "full_attn_as_fp8",
                  "--schedule-config", "full_attn_as_fp8", "--tdc-threshold", "10", "--tdc-budget", "10",
                  "--out", str(out), "--name", "qa"])
    sched = json.loads((out / "qa_schedule.json").read_text())
    assert sched["source"]["row"] == "full_attn_as_fp8"
    assert sched["source"]["overrides"] == {"attention_after_skip": "fp8"}
    cells, rows = sched["branches"]["cond_uncond"], sched["attention"]["cond_uncond"]
    after = [rows[t][b] for t in range(1, len(cells)) for b in range(len(cells[t]))
             if cells[t][b] and not cells[t - 1][b]]
    assert after and set(after) == {"8"}


def test_mode_flip_follows_one_video_and_replays_its_recorded_routes(out, one_thread):
    """A zero nudge leaves the FP32 video identical; replaying a quantized row's recorded schedule unedited
    reproduces that row's video exactly; the edits change the attention routes they name and nothing else."""
    mode_flip.main(["--steps", "4", "--prompts", "3", "--rows", "{'dmpq': ('dmpq_only', {})}",
                    "--nudges", "((0, 0.0), (1, 0.5))", "--out", str(out), "--name", "mf"])
    data = json.loads((out / "mf.json").read_text())
    rows = {(r["kind"], r["row"]): r for r in data["rows"]}
    zero, big = rows[("nudge", "FP32, 0·std noise at step 0")], rows[("nudge", "FP32, 0.5·std noise at step 1")]
    assert math.isinf(zero["psnr"]) and zero["divergence"] == [0.0] * 4
    assert big["divergence"][0] == 0.0 < big["divergence"][1] and math.isfinite(big["psnr"])
    q, replay = rows[("row", "dmpq")], rows[("replay", "as recorded")]
    assert len(q["divergence"]) == 4 and 0 < q["divergence"][-1] and q["attention_fp8"] > 0
    assert replay["psnr"] == q["psnr"] and replay["divergence"] == q["divergence"]
    recorded = replay["attention_routes"]
    assert rows[("replay", "step 0 on 8-bit")]["attention_routes"] == ["8" * len(recorded[0]), *recorded[1:]]
    assert rows[("replay", "steps 0-1 on 8-bit")]["attention_routes"][2:] == recorded[2:]
    assert rows[("replay", "step 2's pattern from step 1")]["attention_routes"] == [recorded[0], *[recorded[2]] * 3]
    md = (out / "mf.md").read_text()
    assert data["reference"]["found"] in md and "| replay | as recorded |" in md and (out / "mf.png").exists()


def test_quality_counts_videos_whose_judge_reading_flips():
    """A shape read differently from the FP32 video's is a flip; the same reading is not; k / n per row."""
    from types import SimpleNamespace

    def verdict(shape, bg="red"):
        return SimpleNamespace(objects=[{"found": {"colour": "yellow", "shape": shape, "motion": "moving down"}}],
                               detected_background=(bg,))

    ref = quality._judge_reading(verdict("circle"))
    assert quality._judge_reading(verdict("circle")) == ref
    assert quality._judge_reading(verdict("square")) != ref != quality._judge_reading(verdict("circle", "blue"))
    assert quality._judge_reading(SimpleNamespace(objects=[{"found": None}], detected_background=())) != ref
    assert quality._changed([{"judge_changed": 1.0}, {"judge_changed": 0.0}, {"judge_changed": 0.0}]) == "1 / 3"
    assert quality._changed([{"psnr": float("inf")}]) == "—"


def test_paired_separates_judged_flips_from_the_numerics(tmp_path):
    """Flips counted per side (the first file's video wins on a repeated key), McNemar exact p-values, the
    paired PSNR difference only over the videos flipped in neither; other generation settings refused."""
    assert paired.mcnemar_p(0, 0) == 1.0 == paired.mcnemar_p(3, 3)
    assert paired.mcnemar_p(0, 5) == pytest.approx(2 / 32) == paired.mcnemar_p(5, 0)
    assert paired.mcnemar_p(1, 4) == pytest.approx(2 * 6 / 32)

    def rec(prompt, seed, psnr, flip, adh=100.0):
        return {"prompt": prompt, "seed": seed, "psnr": psnr, "adherence": adh, "judge_changed": float(flip)}

    gen = {"num_inference_steps": 20}
    a = {"generation": gen, "environment": {"command": "a"}, "runs": {
        "fp16": [rec("p", s, float("inf"), 0) for s in range(4)],
        "full": [rec("p", 0, 30.0, 0), rec("p", 1, 31.0, 0), rec("p", 2, 15.0, 1, 50.0), rec("p", 3, 16.0, 1, 50.0)],
        "x": [rec("p", 0, 30.5, 0), rec("p", 1, 30.0, 0), rec("p", 2, 32.0, 0), rec("p", 3, 17.0, 1, 50.0)]}}
    b = {"generation": gen, "environment": {"command": "b"}, "runs": {
        "full": [rec("p", 4, 40.0, 0), rec("p", 0, 99.0, 0)],  # seed 0 again: the first file's record stays
        "x": [rec("p", 4, 20.0, 1, 0.0), rec("p", 0, 99.0, 0)]}}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    runs, envs = paired.load_runs([pa, pb])
    assert [e["command"] for e in envs] == ["a", "b"] and runs["full"][("p", 0)]["psnr"] == 30.0
    r = paired.compare(runs["full"], runs["x"])
    assert r["videos"] == 5 and (r["flips_base"], r["flips_row"]) == (2, 2)
    assert r["flips_base_only"] == [("p", 2)] and r["flips_row_only"] == [("p", 4)] and r["flips_both"] == [("p", 3)]
    assert r["mcnemar_p"] == 1.0 and r["unflipped"] == 2
    assert r["psnr_diff_unflipped"] == pytest.approx(-0.25) and r["psnr_diff_unflipped_se"] == pytest.approx(0.75)
    assert r["adherence_base"] == pytest.approx(80.0) and r["adherence_row"] == pytest.approx(70.0)
    assert paired.main([str(pa), str(pb), "--base", "full", "--out", str(tmp_path), "--name", "pr"]) == 0
    md = (tmp_path / "pr.md").read_text()
    assert "| 5 | 1 / 1 / 1 | 1.00 | -0.250 ± 0.750 dB (2) |" in md and "p (seed 4)" in md
    assert json.loads((tmp_path / "pr.json").read_text())["rows"]["x"]["flips_row_only"] == [["p", 4]]
    b["generation"] = {"num_inference_steps": 50}
    pb.write_text(json.dumps(b))
    with pytest.raises(SystemExit, match="other settings"):
        paired.load_runs([pa, pb])
    with pytest.raises(SystemExit, match="no row 'y'"):
        paired.main([str(pa), "--rows", "y"])


def test_attention_heads_probe_reads_the_transformers_k(out):
    """``benchmarks.attention_heads`` on the committed sixbit-mini (2 steps, 5 frames): one ratio per head for each
    of the transformer's attention calls (the text encoder's are not counted), the picked share where the ratio is ≥
    ``formats.RESIDUAL_RATIO``, the spec's per-head errors, the real SDPA restored after; ``head_ratios`` is the
    spec's statistic."""
    import torch.nn.functional as F

    from sixbit import formats as spec

    sdpa = F.scaled_dot_product_attention
    attention_heads.main(["--prompts", "1", "--steps", "2", "--frames", "5", "--out", str(out), "--name", "ah"])
    assert F.scaled_dot_product_attention is sdpa
    data = json.loads((out / "ah.json").read_text())
    assert len(data["steps"]) == 2 and len(data["blocks"]) == 12  # sixbit-mini's 12 blocks, one call each
    assert 0 <= data["picked"] <= 1 and data["ratio_quantiles"]["p50"] >= 1
    err = data["relative_l2_rms"]  # the spec's per-head errors: the terms help, counts add up
    assert 0 < err["all"]["terms"] < err["all"]["one_term"] < 0.2
    assert err["picked"]["count"] + err["not picked"]["count"] == err["all"]["count"] == 2 * 12 * 2 * 4
    k = torch.randn(1, 2, 500, 64)
    k[0, 1, :, 3] *= 20
    amax = (k - k.mean(2, keepdim=True)).abs().amax(2)
    assert torch.equal(attention_heads.head_ratios(k) >= 3, spec.attention_residual_heads(amax, 3.0))
    assert attention_heads.head_ratios(k)[0, 1] > 10 > 2 > attention_heads.head_ratios(k)[0, 0]


def test_attention_accuracy_study_writes_every_row(out):
    """The CPU accuracy study of the 8-bit attention's numerics: every row, both inputs, in JSON and markdown."""
    attention_accuracy.main(["--keys", "300", "--rows", "16", "--heads", "1", "--out", str(out), "--name", "aa"])
    data = json.loads((out / "aa.json").read_text())
    err = data["relative_l2"]
    assert set(err) == {label for label, _ in attention_accuracy.ROWS}
    assert all(0 < e[c] < 1 for e in err.values() for c in ("normal", "K outliers"))
    today, split = err["e4m3 QKᵀ (today's kernel)"], err["e4m3 + 8 K channels in bf16"]
    assert split["K outliers"] < 0.5 * today["K outliers"]
    terms = err["e4m3 + residual terms on K's 16 largest channels + V residual"]  # the kernel's accuracy option
    assert terms["K outliers"] < 0.5 * today["K outliers"] and data["block_n"] == sk.attention_fp8.CONFIGS[64][1]
    ratios = data["ratio_study"]["rows"]  # the outlier strength that residual_ratio picks heads by
    assert [r["factor"] for r in ratios] == list(attention_accuracy.RATIO_FACTORS)
    assert ratios[0]["picked_heads"] == 0 and ratios[-1]["picked_heads"] == ratios[-1]["heads"] == 1
    assert ratios[-1]["ratio_min"] > 10 and ratios[-1]["one_term"] > 2 * ratios[-1]["terms"]
    assert ratios[-1]["one_term"] > ratios[0]["one_term"] and "| ×20 | " in (out / "aa.md").read_text()
    both16 = err["all 64 channels in bf16, **P·V in bf16**"]  # the 16-bit products: below every 8-bit row
    assert all(both16[c] < e[c] for e in err.values() if e is not both16 for c in ("normal", "K outliers"))
    md = (out / "aa.md").read_text()
    assert f"| e4m3 + 8 K channels in bf16 | {split['normal']:.2%} | {split['K outliers']:.2%} |" in md
    two = data["two_term"]["relative_l2"]  # the two-term study: every pair, both inputs, one markdown row per QKᵀ
    assert set(two) == {f"{a} | {b}" for a, _ in attention_accuracy.SPLIT_QK for b, _ in attention_accuracy.SPLIT_PV}
    assert all(0 < e[c] < 1 for e in two.values() for c in ("normal", "K outliers"))
    cell = two["e4m3, 2 terms on all 64 channels | V in 2 terms"]
    assert "| e4m3, 2 terms on all 64 channels | ×3 | " in md and f"{cell['normal']:.2%} / {cell['K outliers']:.2%}" in md


def test_two_term_study_starts_from_the_spec_and_each_term_helps():
    """``attention_accuracy.two_term_study``: its one-term cell is the spec's attention (up to where the row
    maximum is taken), a second e4m3 term is the residual on the same scale, and each added term lowers the error
    where the study says it does (K outliers: the QKᵀ terms on K's largest channels; P·V: V's then P's)."""
    from sixbit import formats as spec

    x = torch.randn(1000) * 30
    hi, lo = spec.attention_e4m3_terms(x)  # the study takes the spec's terms
    assert torch.equal(hi, x.to(torch.float8_e4m3fn).float())
    assert (x - hi - lo).abs().max() < 0.2 * (x - hi).abs().max()
    assert attention_accuracy.qk_work(None) == attention_accuracy.qk_work(0) == 1 and attention_accuracy.qk_work(16) == 1.5
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, n, 64, generator=g) for n in (24, 600, 600))
    k[..., :5] *= 20
    q, k, v = (t.bfloat16() for t in (q, k, v))
    exact = torch.softmax(q.float() @ k.float().transpose(-1, -2) / 8, -1) @ v.float()
    err = {key: float(spec.relative_error(o, exact)) for key, o in attention_accuracy.two_term_study(q, k, v).items()}
    today = err["e4m3 (today's kernel) | P, V e4m3 (today)"]
    assert today == pytest.approx(float(spec.relative_error(spec.attention_fp8_reference(q, k, v, block_n=256), exact)),
                                  rel=0.1)
    assert err["e4m3 + 2nd terms on K's 8 largest channels | P, V e4m3 (today)"] < 0.4 * today
    for qk in ("QKᵀ in fp32", "e4m3 + 2nd terms on K's 16 largest channels", "e4m3, 2 terms on all 64 channels"):
        one, v2, pv2 = (err[f"{qk} | {pv}"] for pv, _ in attention_accuracy.SPLIT_PV)
        assert pv2 < v2 < one, qk
    assert err["QKᵀ in fp32 | P and V in 2 terms"] < 0.002


def test_quality_same_skips_row_needs_its_source_first(out):
    with pytest.raises(SystemExit, match="dmpq_tdc"):
        quality.main(["--prompts", "1", "--configs", "fp16", "full_same_skips", "--out", str(out)])


def test_speed_smoke_at_tiny_size(out, one_thread):
    speed.main(["--sizes", "tiny", "--steps", "3", "--frames", "9", "--height", "32", "--width", "32",
                "--configs", "bf16", "w8a8", "tdc_only", "--device", "cpu", "--out", str(out), "--name", "s"])
    data = json.loads((out / "s.json").read_text())
    rec = data["models"]["tiny"]
    assert set(rec["configs"]) == {"bf16", "w8a8", "tdc_only"}
    for e in rec["configs"].values():
        assert "error" not in e, e.get("error")
        assert e["denoise_s"] > 0
    assert rec["configs"]["w8a8"]["avg_act_bits"] == pytest.approx(8.0)
    for e in rec["configs"].values():  # an identical warm-up loop ran, and every timed step was checked
        assert e["warmup_s"] > 0 and e["step_check"]["worst"] >= 1.0 and len(e["step_s"]) == 3
        # step 0 starts at the transformer's first call: the set-up before it is in the total only
        assert e["setup_s"] > 0 and sum(e["step_s"]) + e["setup_s"] == pytest.approx(e["denoise_s"], abs=0.05)
    # the kinds come from the real trace (computed block evaluations per step); bf16 has one kind
    assert min(rec["configs"]["w8a8"]["step_check"]["kinds"]) > 0
    assert set(rec["configs"]["bf16"]["step_check"]["kinds"]) == {0}
    md = (out / "s.md").read_text()
    assert "| bf16 diffusers baseline |" in md and "| static W8A8 |" in md
    # re-rendering the JSON gives the same table
    (out / "s.md").unlink()
    speed.main(["--render", str(out / "s.json")])
    assert (out / "s.md").read_text() == md


def test_speed_replays_the_attention_routes(out, one_thread):
    """A format-3 schedule's attention routes are replayed (8-bit emulated on the CPU) by the method rows;
    the *_bf16attn rows keep bf16; the table has the column and apply's compile time (CPU: none)."""
    from sixbit.tdc import SkipSchedule

    # the tiny size's depth: no resampling; steps 0-1 are the presets' full-precision warm-up (bf16 attention)
    n_steps, n_blocks = 5, 3
    sched = SkipSchedule(n_blocks, n_steps, {"cond_uncond": [[True] * 3] * 3 + [[True, False, False], [True] * 3]},
                         {"model": "test"},
                         {"cond_uncond": [["ff"] * 3, ["ff"] * 3, ["nn"] * 3, ["ii", "", ""], ["ff", "nn", "nn"]]},
                         {"cond_uncond": ["bbb", "bbb", "888", "b--", "b8b"]})
    path = sched.save(out / "att_sched.json")
    assert SkipSchedule.load(path).attention_fp8_fraction == pytest.approx(4 / 13)
    speed.main(["--sizes", "tiny", "--steps", str(n_steps), "--frames", "9", "--height", "32", "--width", "32",
                "--configs", "full", "full_bf16attn", "--warmup-steps", "1", "--schedule", str(path),
                "--device", "cpu", "--out", str(out), "--name", "sa"])
    data = json.loads((out / "sa.json").read_text())
    cfgs = data["models"]["tiny"]["configs"]
    assert "error" not in cfgs["full"], cfgs["full"].get("error")
    assert cfgs["full"]["attention_fp8"] == pytest.approx(4 / 13) and cfgs["full_bf16attn"]["attention_fp8"] == 0
    assert cfgs["full"]["kernels_compiled_s"] is None  # CPU: apply compiles nothing
    md = (out / "sa.md").read_text()
    assert "| 8-bit attn |" in md and f"{4 / 13:.0%} of the computed block evaluations 8-bit" in md


def test_speed_row_schedules(out, one_thread):
    """--row-schedule CONFIG=PATH: that row replays its own schedule in the same run (the others --schedule);
    a wrong spec, a row not in --configs, a missing file or a schedule of another scope are refused up front."""
    from sixbit.tdc import SkipSchedule

    n_steps, n_blocks = 3, 3
    every = SkipSchedule(n_blocks, n_steps, {"cond_uncond": [[True] * 3] * 3}, {"model": "test"})
    some = SkipSchedule(n_blocks, n_steps, {"cond_uncond": [[True] * 3, [True, False, False], [True] * 3]},
                        {"model": "test"})
    p_every, p_some = every.save(out / "every.json"), some.save(out / "some.json")
    args = ["--sizes", "tiny", "--steps", str(n_steps), "--frames", "9", "--height", "32", "--width", "32",
            "--warmup-steps", "1", "--device", "cpu", "--out", str(out)]
    speed.main([*args, "--configs", "tdc_only", "full", "--schedule", str(p_every),
                "--row-schedule", f"full={p_some}", "--name", "rs"])
    data = json.loads((out / "rs.json").read_text())
    cfgs = data["models"]["tiny"]["configs"]
    assert cfgs["tdc_only"]["schedule"] == str(p_every) and cfgs["full"]["schedule"] == str(p_some)
    assert cfgs["tdc_only"]["skip_fraction"] == 0 and cfgs["full"]["skip_fraction"] == pytest.approx(2 / 9)
    assert data["row_schedules"]["full"]["skip_fraction"] == pytest.approx(2 / 9)
    assert "`full` replays its own schedule `some.json` (22%" in (out / "rs.md").read_text()
    for bad, match in ((["full"], "CONFIG=PATH"), ([f"tdc_attn={p_some}"], "not one of --configs"),
                       ([f"full={out / 'none.json'}"], "no schedule file"),
                       ([f"tdc_attn={p_some}"], "tdc_attn")):
        configs = ["full", "tdc_attn"] if bad[0].startswith("tdc_attn") and match == "tdc_attn" else ["full"]
        with pytest.raises(SystemExit, match=match):
            speed.main([*args, "--configs", *configs, "--row-schedule", *bad, "--name", "bad"])


def test_tdc_probe_records_the_probe_drift_per_route(out, one_thread):
    from benchmarks import tdc_probe

    assert tdc_probe.parse_row('full:tdc_probe_route=int8,tdc_probe_threshold=0.1') == (
        "full", {"tdc_probe_route": "int8", "tdc_probe_threshold": 0.1})
    with pytest.raises(SystemExit, match="field=value"):
        tdc_probe.parse_row("full:oops")
    tdc_probe.main(["--steps", "4", "--rows", "full", "full:tdc_probe_route=policy", "--out", str(out), "--name", "tp"])
    data = json.loads((out / "tp.json").read_text())
    fp, pol = data["rows"]
    # after the two full-precision warm-up steps (the default): the probe's own route
    assert [s["mode"] for s in fp["steps"]] == ["warmup"] * 2 + ["probe"] * 2
    assert "probe" not in {s["mode"] for s in pol["steps"]}
    assert all(s["drift"] is not None for s in fp["steps"][1:]) and fp["steps"][0]["drift"] is None
    assert "| `full:tdc_probe_route=policy` |" in (out / "tp.md").read_text()


def test_weights_counts_packed_bytes(out, monkeypatch):
    # the real sizes take minutes on 2 cores; a small CogVideoX has the same structure
    monkeypatch.setitem(common.SIZES, "2b", dict(num_attention_heads=2, attention_head_dim=32, num_layers=2,
                                                 text_embed_dim=64, time_embed_dim=32, sample_height=8,
                                                 sample_width=8, sample_frames=9, max_text_seq_length=16,
                                                 in_channels=4, out_channels=4, use_rotary_positional_embeddings=True))
    weights.main(["--sizes", "2b", "--out", str(out), "--name", "w"])
    r = json.loads((out / "w.json").read_text())["models"]["2b"]
    v = r["variants"]
    full, mod, emb = (v["full"], v["full, 4-bit modulation weights"],
                      v["full, 4-bit modulation + embedder weights"])
    # more layers packed → fewer bytes; every variant is smaller than bf16; NVFP4 cannot beat 16/4.5
    assert r["bf16_bytes"] > full["resident_bytes"] > mod["resident_bytes"] > emb["resident_bytes"]
    assert emb["param_reduction"] < 16 / 4.5
    assert v["w8a8"]["param_reduction"] < 2.0
    assert all(e["param_reduction"] >= e["reduction"] * 0.999 for e in v.values())
    md = (out / "w.md").read_text()
    assert "4-bit modulation + embedder weights" in md and "parameters GiB" in md
    assert torch.get_default_dtype() == torch.float32  # the bf16 default used while building is restored


def test_weights_of_the_text_encoder(out, monkeypatch):
    monkeypatch.setattr(weights, "T5XXL_CONFIG", dict(vocab_size=64, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                   num_heads=4, feed_forward_proj="gated-gelu",
                                                   is_encoder_decoder=False, use_cache=False))
    cli.main(["weights", "--sizes", "t5xxl", "--out", str(out), "--name", "te"])  # through python -m benchmarks
    r = json.loads((out / "te.json").read_text())["models"]["t5xxl"]
    (e,) = r["variants"].values()
    assert 1.0 < e["reduction"] < 16 / 4.5 and e["memory"]["packed_bytes"] > 0
    assert "| T5-XXL text encoder | bf16 |" in (out / "te.md").read_text()
    assert torch.get_default_dtype() == torch.float32


def test_phase_peaks_split_a_pipeline_call_into_encode_denoise_decode(monkeypatch, one_thread):
    from sixbit.testing import generate, tiny_cogvideox_pipeline

    pipe = tiny_cogvideox_pipeline(seed=0)
    with memory.PhasePeaks(pipe, "cpu") as pp:
        generate(pipe, output_type="pt")
    assert list(pp.phases) == ["encode", "denoise", "decode"]  # on a CPU: the order only
    assert all(v == {"start_bytes": None, "peak_bytes": None, "peak_reserved_bytes": None} for v in pp.phases.values())

    # the CUDA bookkeeping, with the allocator's counters simulated: each phase's peak is read before the reset
    state = {"alloc": 100, "peak": 100}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: state["alloc"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: state["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: state["peak"] + 1)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: state.update(peak=state["alloc"]))
    bumps = iter([(150, 900), (400, 700), (120, 5000)])  # (allocated after, transient peak) per phase

    def work(*_a):
        a, p = next(bumps)
        state.update(alloc=a, peak=max(state["peak"], p))

    pp = memory.PhasePeaks(pipe, "cuda")
    with pp:
        work()                        # encode
        pp._enter("denoise")
        work()
        pp._enter("denoise")          # repeated calls of the same phase change nothing
        pp._enter("decode")
        work()
    assert pp.phases == {"encode": {"start_bytes": 100, "peak_bytes": 900, "peak_reserved_bytes": 901},
                         "denoise": {"start_bytes": 150, "peak_bytes": 700, "peak_reserved_bytes": 701},
                         "decode": {"start_bytes": 400, "peak_bytes": 5000, "peak_reserved_bytes": 5001}}


def test_pipeline_memory_rows_run_end_to_end_on_cpu(one_thread):
    pipe = common.random_cogvideox("tiny", torch.device("cpu"), torch.float32)
    call = dict(prompt="a red circle", height=32, width=32, num_frames=9, guidance_scale=6.0, max_sequence_length=16,
                generator=torch.Generator("cpu").manual_seed(0))
    res = memory.pipeline_memory(pipe, call, torch.device("cpu"), None)
    assert list(res) == list(memory.PIPELINE_MEMORY_ROWS)
    for name, row in res.items():
        assert "error" not in row, (name, row.get("traceback"))
        assert list(row["phases"]) == ["encode", "denoise", "decode"] and "peak_bytes" not in row  # no bytes on CPU
        assert row["loading"] == memory.PIPELINE_MEMORY_ROWS[name][1]
        assert row["text_encoder_4bit"] == (name == "full_lean")
    # the app's 6Bit row: balanced applied to the resident pipeline, the prompt passed as the app passes it
    assert res["app_balanced"]["config"] == "balanced" and res["app_balanced"]["loading"] == "resident"
    fake = {"size": "2b", "slice_bytes": memory.SLICE_BYTES, "environment": {"date": "d"}, "command": "c",
            "rows": {"bf16": {"phases": {}, "before_row_bytes": 0, "peak_bytes": 30 * 2**30,
                              "peak_reserved_bytes": 46 * 2**30}}}
    md = memory.report(fake)
    assert "headroom 14.70 GiB (fits)" in md and "headroom -1.30 GiB (DOES NOT FIT)" in md
    te = res["full_lean"]["text_encoder_memory"]
    assert 0 < te["packed_bytes"] < te["original_bytes"]
    # every part is back where it was, unwrapped: a plain call works again
    assert not any(type(m).__name__ == "SixBitLinear" for m in [*pipe.transformer.modules(), *pipe.text_encoder.modules()])
    pipe(**call, num_inference_steps=1, output_type="latent")


def test_step_check_flags_a_slow_step_against_its_own_kind():
    """A step is compared with the median of the steps that computed as many blocks: a compile inside the
    timed loop (one slow computed step) is flagged; skipped-heavy steps being faster is not."""
    steps = [0.60, 0.61, 1.30, 0.59, 0.20, 0.21, 0.22, 0.60]
    kinds = [10, 10, 10, 10, 2, 2, 2, 10]
    check = speed.step_outliers(steps, kinds)
    assert [o["step"] for o in check["outliers"]] == [2] and check["worst"] == pytest.approx(1.3 / 0.60)
    assert speed.step_outliers([0.6, 0.61, 0.59], [10, 10, 10])["outliers"] == []
    trace = {"steps": [{"blocks": [{"computed": True}, {"computed": False}]},
                       {"blocks": [{"computed": True}, {"computed": True}],
                        "other_branches": {"uncond": {"blocks": [{"computed": False}, {"computed": True}]}}}]}
    assert speed.step_kinds(trace, 2) == [1, 3] and speed.step_kinds(None, 3) == [0, 0, 0]
    # attention scope: a cell that reused its attention (computed and skipped) is not a computed one
    reused = {"steps": [{"blocks": [{"computed": True, "skipped": False}, {"computed": True, "skipped": True}]}] * 2}
    assert speed.step_kinds(reused, 2) == [1, 1]
    # DMPQ's full-precision first steps (every linear on the 16-bit route) are a kind of their own
    blocks = [{"computed": True, "skipped": False}] * 2
    dmpq = {"steps": [{"blocks": blocks, "routes": ["fp16", "fp16"]},
                      {"blocks": blocks, "routes": ["int8", "fp16"]},
                      {"blocks": [blocks[0], {"computed": False, "skipped": True}], "routes": ["fp16", "skipped"]}]}
    assert speed.step_kinds(dmpq, 3) == ["2 at 16 bits", 2, "1 at 16 bits"]
    check = speed.step_outliers([0.55, 0.56, 0.44, 0.45, 0.44], ["2 at 16 bits"] * 2 + [2] * 3)
    assert check["outliers"] == [] and check["worst"] == pytest.approx(0.45 / 0.44)


def test_compile_log_maps_compiles_to_steps_and_restores_the_hook():
    """The speed bench's record of Triton compiles inside a timed loop: the hook records and then defers to
    the one installed before it (returning its answer, so a cache hook that skips compiles still works), is
    removed afterwards, and each compile lands on the step whose interval holds it (−1: before the loop)."""
    from triton import knobs

    from benchmarks.common import compile_log, events_by_step

    seen = []
    prev = knobs.runtime.jit_cache_hook

    def outer(*a, **kw):
        seen.append(kw["repr"])
        return False

    knobs.runtime.jit_cache_hook = outer
    try:
        with compile_log() as log:
            assert knobs.runtime.jit_cache_hook is not outer
            assert knobs.runtime.jit_cache_hook(repr="_k[num_warps=4](x: *fp32)") is False
        assert knobs.runtime.jit_cache_hook is outer and seen == ["_k[num_warps=4](x: *fp32)"]
    finally:
        knobs.runtime.jit_cache_hook = prev
    assert len(log) == 1 and log[0][1] == "_k[num_warps=4](x: *fp32)"
    marks = [10.0, 11.0, 12.0, 13.0]  # loop start, then the ends of steps 0, 1, 2
    synthetic = [(9.5, "a"), (10.5, "b"), (12.2, "c"), (12.9, "d")]
    assert events_by_step(synthetic, marks) == [{"step": -1, "kernel": "a"}, {"step": 0, "kernel": "b"},
                                                  {"step": 2, "kernel": "c"}, {"step": 2, "kernel": "d"}]
    assert events_by_step([None], marks) is None and events_by_step([], marks) == []
    assert speed._check_cell({"worst": 1.1, "outliers": [], "ratio": 1.2}, [{"step": 8, "kernel": "k"}] * 2) \
        == "1.10 · 2 Triton compile(s) timed, step(s) 8"


def test_gc_log_records_pauses_inside_and_leaves_the_collector_as_it_was():
    import gc

    from benchmarks.common import events_by_step, gc_log

    n_callbacks = len(gc.callbacks)
    with gc_log(min_s=0.0) as paused:
        assert gc.get_freeze_count() > 0  # the heap that existed before is frozen
        gc.collect(2)
    assert gc.get_freeze_count() == 0 and len(gc.callbacks) == n_callbacks
    assert paused and paused[-1][1] == "gc gen2" and paused[-1][2] >= 0
    marks = [paused[-1][0] - 1.0, paused[-1][0] + 1.0]
    assert events_by_step(paused[-1:], marks) == [{"step": 0, "kernel": "gc gen2", "s": paused[-1][2]}]
    assert "GC 12 ms at step 3" in speed._check_cell({"worst": 1.0, "outliers": [], "ratio": 1.2}, [],
                                                       [{"step": 3, "kernel": "gc gen2", "s": 0.012}])

"""`qwen-desk fit` and `qwen-desk models`: the JSON contract, the human output and every bad input."""

import json
import subprocess
import sys

import pytest

from macapp.cli import main

FIT_FIELDS = {
    "model",
    "repo",
    "bits",
    "context",
    "weights_bytes",
    "kv_cache_bytes",
    "state_bytes",
    "overhead_bytes",
    "total_bytes",
    "budget_bytes",
    "verdict",
    "max_context",
    "decode_tps_estimate",
    "prefill_tps_estimate",
    "ttft_estimate_s",
    "advice",
}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_json_contract_from_a_real_process():
    result = subprocess.run(
        [sys.executable, "-m", "macapp", "fit", "Qwen3.5-35B-A3B", "--bits", "4", "--context", "262144", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert FIT_FIELDS <= set(data)
    assert data["model"] == "Qwen3.5-35B-A3B" and data["repo"] == "mlx-community/Qwen3.5-35B-A3B-4bit"
    assert data["bits"] == 4 and data["context"] == 262144
    assert data["verdict"] in ("fits", "tight", "too_big")
    assert data["total_bytes"] == data["weights_bytes"] + data["kv_cache_bytes"] + data["state_bytes"] + data["overhead_bytes"]
    assert data["kv_cache_bytes"] == 5_368_709_120


def test_fit_what_if_machine(capsys):
    code, out, _ = run_cli(capsys, "fit", "qwen3.5-122b-a10b", "--bits", "8", "--chip", "M3 Ultra", "--memory", "512GB", "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"] == "fits" and data["max_context"] == 1_010_000  # YaRN ×4 past 262,144
    assert data["yarn_factor"] is None and data["native_context"] == 262144
    assert data["decode_tps_estimate"] == pytest.approx(42.5, rel=0.12)
    code, out, _ = run_cli(capsys, "fit", "Qwen3.5-397B-A17B", "--chip", "M4 Max", "--memory", "128GB", "--json")
    assert json.loads(out)["verdict"] == "too_big"


def test_fit_kv_bits_and_context_suffix(capsys):
    _, plain, _ = run_cli(capsys, "fit", "Qwen3.5-9B", "--context", "128k", "--chip", "M4", "--memory", "16GB", "--json")
    _, quant, _ = run_cli(capsys, "fit", "Qwen3.5-9B", "--context", "128k", "--kv-bits", "4", "--chip", "M4", "--memory", "16GB", "--json")
    plain, quant = json.loads(plain), json.loads(quant)
    assert plain["context"] == 131072
    assert quant["kv_cache_bytes"] < plain["kv_cache_bytes"] / 3


def test_fit_human_output_is_a_short_breakdown(capsys):
    code, out, _ = run_cli(capsys, "fit", "Qwen3.5-35B-A3B", "--chip", "M4 Pro", "--memory", "48GB")
    assert code == 0
    for words in ("weights", "KV cache", "DeltaNet state", "overhead", "total", "largest context", "tok/s"):
        assert words in out
    assert len(out.splitlines()) <= 10


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fit", "Qwen3.5-36B"], "unknown model"),
        (["fit", "Qwen3.5-9B", "--chip", "M9", "--memory", "16GB"], "M9"),
        (["fit", "Qwen3.5-9B", "--chip", "M4", "--memory", "lots"], "cannot read memory"),
        (["fit", "Qwen3.5-9B", "--context", "0"], "at least 1 token"),
        (["fit", "Qwen3.5-9B", "--context", "2m"], "maximum of 1,010,000 tokens (262,144 native"),
        (["fit", "/no/such/folder"], "not a folder"),
    ],
)
def test_fit_bad_input_gives_a_clear_message_and_nonzero_exit(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err and out == ""


def test_fit_nonsense_config_in_a_folder(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "hidden_size": "big"}}))
    code, _, err = run_cli(capsys, "fit", str(tmp_path))
    assert code == 2 and "hidden_size" in err


@pytest.mark.parametrize("context", ["0", "1000k"])
def test_models_refuses_a_context_outside_the_family(capsys, context):
    code, out, err = run_cli(capsys, "models", "--context", context)
    assert code == 2 and out == "" and "between 1 and 1,010,000" in err


def test_argparse_rejects_bad_bits_and_context():
    with pytest.raises(SystemExit) as exc:
        main(["fit", "Qwen3.5-9B", "--bits", "3"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["fit", "Qwen3.5-9B", "--context", "lots"])


def test_models_lists_every_build_with_verdicts(capsys):
    code, out, _ = run_cli(capsys, "models", "--context", "8192", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 16
    assert {r["bits"] for r in rows} == {4, 8}
    assert all(r["verdict"] in ("fits", "tight", "too_big") and "downloaded" in r for r in rows)
    small = next(r for r in rows if r["model"] == "Qwen3.5-0.8B" and r["bits"] == 4)
    huge = next(r for r in rows if r["model"] == "Qwen3.5-397B-A17B" and r["bits"] == 8)
    assert small["verdict"] == "fits" and huge["verdict"] == "too_big"
    code, out, _ = run_cli(capsys, "models")
    assert code == 0 and "Qwen3.5-35B-A3B" in out and "GPU budget" in out


def test_models_refresh_reports_what_it_could_not_read(capsys, hub_server):
    code, out, err = run_cli(capsys, "models", "--refresh", "--json")
    assert code == 0 and len(json.loads(out)) == 16
    assert "could not refresh mlx-community/Qwen3.5-35B-A3B-4bit" in err and "built-in data" in err


def test_models_marks_downloaded_builds(capsys, hub_server, tiny_moe_4bit_path):
    from macapp.core.download import download

    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", tiny_moe_4bit_path)
    result = download("mlx-community/Qwen3.5-0.8B-4bit")
    assert result.verified
    _, out, _ = run_cli(capsys, "models", "--json")
    marked = {(r["model"], r["bits"]) for r in json.loads(out) if r["downloaded"]}
    assert marked == {("Qwen3.5-0.8B", 4)}


def test_fit_json_reads_the_prompt_and_says_how_long(capsys):
    code, out, _ = run_cli(capsys, "fit", "Qwen3.5-35B-A3B", "--context", "20000", "--chip", "M4 Pro", "--memory", "48GB", "--json")
    data = json.loads(out)
    assert code == 0 and data["context"] == 20000
    assert 100 < data["prefill_tps_estimate"] < 5000
    assert data["ttft_estimate_s"] == pytest.approx(20000 / data["prefill_tps_estimate"], rel=0.01)
    assert data["advice"] == {"verdict": "fits", "headline": "", "steps": []}


def test_fit_human_output_says_how_long_reading_takes(capsys):
    _, out, _ = run_cli(capsys, "fit", "Qwen3.5-35B-A3B", "--context", "20000", "--chip", "M4 Pro", "--memory", "48GB")
    line = next(line for line in out.splitlines() if "reading a 20,000-token prompt: ~" in line)
    assert line.strip().split(": ~")[1].split(" (")[0].endswith(" s") and "estimate" in line and "tok/s" in line


def test_fit_too_big_names_the_wired_limit_command_and_the_other_ways(capsys):
    _, out, _ = run_cli(capsys, "fit", "Qwen3.5-35B-A3B", "--context", "8192", "--chip", "M4 Pro", "--memory", "24GB")
    assert "no context fits (ways out below)" in out and "choose a smaller model or 4-bit" not in out
    assert "1. let macOS wire more memory for the GPU: run `sudo sysctl iogpu.wired_limit_mb=" in out
    assert "resets at reboot" in out and "2. choose the next build down that fits" in out
    _, out, _ = run_cli(capsys, "fit", "Qwen3.5-35B-A3B", "--context", "8192", "--chip", "M4 Pro", "--memory", "24GB", "--json")
    step = json.loads(out)["advice"]["steps"][0]
    assert step["remedy"] == "wired_limit" and step["command"] == f"sudo sysctl iogpu.wired_limit_mb={step['wired_limit_mb']}"


def test_fit_at_32k_on_a_24gb_m4_pro_advises_the_wired_limit_with_the_longest_context(capsys):
    base = ["fit", "Qwen3.5-35B-A3B", "--bits", "4", "--chip", "M4 Pro", "--memory", "24GB", "--context", "32768"]
    _, out, _ = run_cli(capsys, *base, "--json")
    step = json.loads(out)["advice"]["steps"][0]
    assert step["remedy"] == "wired_limit" and 0 < step["context"] < 32768
    _, text, _ = run_cli(capsys, *base)
    assert f"1. {step['text']}" in text  # the words and the number are the one step's, in text and JSON alike
    assert f"`{step['command']}`" in text and f"up to {step['context']:,} tokens" in text
    # The what-if with that limit and that context agrees: it runs.
    limit = ["--wired-limit", str(step["wired_limit_mb"]), "--json"]
    _, out, _ = run_cli(capsys, *base[:-1], str(step["context"]), *limit)
    assert json.loads(out)["verdict"] in ("fits", "tight")


def test_fit_warns_about_a_mac_that_does_not_exist_and_still_answers(capsys):
    code, out, err = run_cli(capsys, "fit", "Qwen3.5-9B", "--chip", "M4 Pro", "--memory", "3TB")
    assert code == 0 and "FITS" in out  # a warning, not a refusal
    assert "warning: no Mac with an Apple M4 Pro has 3,072 GB of memory: it comes with at most 64 GB" in err
    code, out, err = run_cli(capsys, "fit", "Qwen3.5-9B", "--chip", "M4 Pro", "--memory", "3TB", "--json")
    assert code == 0 and json.loads(out)["verdict"] == "fits" and "at most 64 GB" in err  # stdout stays JSON
    code, _, err = run_cli(capsys, "fit", "Qwen3.5-9B", "--chip", "M4 Pro", "--memory", "64GB")
    assert code == 0 and err == ""


def test_fit_wired_limit_answers_what_if_i_raised_it(capsys):
    base = ["fit", "Qwen3.5-35B-A3B", "--context", "8192", "--chip", "M4 Pro", "--memory", "24GB", "--json"]
    _, out, _ = run_cli(capsys, *base)
    before = json.loads(out)
    _, out, _ = run_cli(capsys, *base, "--wired-limit", "20GB")
    after = json.loads(out)
    assert before["verdict"] == "too_big" and after["verdict"] in ("fits", "tight")
    assert after["budget_bytes"] == 20 * 1024**3 and after["max_context"] > 0
    _, same, _ = run_cli(capsys, *base, "--wired-limit", "20480")  # MB, as sysctl takes it
    assert json.loads(same)["budget_bytes"] == after["budget_bytes"]
    _, out, _ = run_cli(capsys, *base[:-1], "--wired-limit", "20GB")
    assert "iogpu.wired_limit_mb=20480" in out and "leaves" in out


@pytest.mark.parametrize(
    "value, message",
    [
        ("lots", "cannot read --wired-limit"),
        ("0", "macOS's default"),
        ("24", "did you mean 24GB"),
        ("64GB", "more than this Mac's 24 GB"),
    ],
)
def test_fit_wired_limit_bad_values(capsys, value, message):
    code, out, err = run_cli(capsys, "fit", "Qwen3.5-9B", "--chip", "M4 Pro", "--memory", "24GB", "--wired-limit", value)
    assert code == 2 and out == "" and message in err


def test_models_json_rows_carry_reading_time_and_advice(capsys):
    code, out, _ = run_cli(capsys, "models", "--context", "8192", "--json")
    rows = json.loads(out)
    assert code == 0 and all({"prefill_tps_estimate", "ttft_estimate_s", "advice"} <= set(r) for r in rows)
    huge = next(r for r in rows if r["model"] == "Qwen3.5-397B-A17B" and r["bits"] == 8)
    assert huge["advice"]["verdict"] == "too_big" and huge["advice"]["headline"]


def test_fit_wired_limit_needs_a_mac(capsys):
    from macapp.core import hardware

    if hardware.detect_machine(use_mlx=False).is_apple_silicon:
        pytest.skip("this test is about a machine that is not a Mac")
    code, out, err = run_cli(capsys, "fit", "Qwen3.5-9B", "--wired-limit", "20GB")
    assert code == 2 and out == "" and "give --chip" in err


def test_models_lists_the_wired_limit_commands(capsys):
    from macapp.cli.fit import _print_wired_limit_notes, catalog_refs
    from macapp.core import hardware
    from macapp.core.fit import advice, estimate

    machine = hardware.what_if_machine("M4 Pro", 24 * 1024**3)
    refs = catalog_refs()
    rows = []
    for ref in refs:
        e = estimate.estimate(ref, 8192, machine)
        rows.append({**e.to_json(), "advice": advice.advise(ref, e, machine, refs).to_json()})
    _print_wired_limit_notes(rows)
    out = capsys.readouterr().out
    assert "Qwen3.5-35B-A3B 4-bit: `sudo sysctl iogpu.wired_limit_mb=" in out
    assert "resets at reboot" in out and "never changes it" in out
    assert "Qwen3.5-397B-A17B" not in out  # no limit a 24 GB Mac can set holds it
    assert "up to" not in out  # at 8K the raised limit holds the whole context
    ref = next(r for r in refs if r.name == "Qwen3.5-35B-A3B" and r.bits == 4)
    e = estimate.estimate(ref, 32768, machine)
    _print_wired_limit_notes([{**e.to_json(), "advice": advice.advise(ref, e, machine, refs).to_json()}])
    out = capsys.readouterr().out
    assert "Qwen3.5-35B-A3B 4-bit: `sudo sysctl iogpu.wired_limit_mb=20480` (up to 22,784 tokens, leaves 4.3 GB for macOS)" in out


def test_an_unreadable_wired_limit_is_named_before_asking_for_a_chip(capsys):
    from macapp.core import hardware

    if hardware.detect_machine(use_mlx=False).is_apple_silicon:
        pytest.skip("on a Mac the flag needs no --chip")
    assert main(["fit", "Qwen3.5-9B", "--wired-limit", "abc"]) == 2
    err = capsys.readouterr().err
    assert "cannot read --wired-limit 'abc'" in err and "--chip" not in err
    assert main(["fit", "Qwen3.5-9B", "--wired-limit", "28GB"]) == 2  # readable: now the chip is what is missing
    assert "give --chip too" in capsys.readouterr().err


def test_fit_says_how_many_agent_sessions_run_at_once(capsys):
    """Each session keeps its own KV cache (growing with the context) and DeltaNet state beside one copy of the weights."""
    args = ("fit", "Qwen3.5-35B-A3B", "--chip", "M4 Max", "--memory", "64GB", "--json")
    short = json.loads(run_cli(capsys, *args, "--context", "8192")[1])
    long = json.loads(run_cli(capsys, *args, "--context", "131072")[1])
    per = long["kv_cache_bytes"] + long["state_bytes"]
    room = long["budget_bytes"] - long["weights_bytes"] - long["overhead_bytes"]
    assert long["parallel_sessions"] == room // per >= 1
    assert short["parallel_sessions"] > long["parallel_sessions"]
    big = json.loads(run_cli(capsys, "fit", "Qwen3.5-397B-A17B", "--chip", "M4 Max", "--memory", "128GB", "--json")[1])
    assert big["parallel_sessions"] == 0
    _, text, _ = run_cli(capsys, *args[:-1], "--context", "8192")
    assert f"{short['parallel_sessions']:,} agent sessions at once at 8,192 tokens each (qwen-desk serve)" in text

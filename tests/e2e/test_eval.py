"""`thresher eval`: pass@k of the tiny model on held-out prompts, into `evals`."""

import os
import signal
import subprocess
import sys
import time

from helpers import ingest_arithmetic

from thresher.stores.lake import Lake


def test_eval_writes_pass_at_k_and_resumes(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake, split="eval")
    cmd = [
        sys.executable,
        "-m",
        "thresher.flows.cli",
        "eval",
        "--model",
        str(tiny_model),
        "--dataset",
        "arith",
        "-k",
        "1",
        "-k",
        "4",
        "--n",
        "4",
        "--limit",
        "24",
        "--max-tokens",
        "24",
        "--dtype",
        "float32",
        "--lake",
        str(lake.root),
        "--no-progress",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    evals = lake.query("SELECT task, metric, value, prompts, samples FROM evals ORDER BY 1, 2")
    got = {(r["task"], r["metric"]): r for r in evals.iter_rows(named=True)}
    prior = {"constant-answer", "pass@1 non-modal"}  # the answer prior, beside pass@k
    assert set(got) == {
        (task, metric) for task in ("all", "arithmetic") for metric in ("pass@1", "pass@4", *prior)
    }
    # by hand: the commonest reference among the 24 prompts evaluated, and its share
    refs = lake.query(
        "SELECT DISTINCT p.prompt_id, p.answer FROM candidates c JOIN prompts p USING (prompt_id)"
    )["answer"].to_list()
    top = max(refs.count(a) for a in set(refs))
    assert got["all", "constant-answer"]["value"] == top / 24
    assert got["all", "pass@1 non-modal"]["prompts"] == 24 - top
    p1, p4 = got["all", "pass@1"]["value"], got["all", "pass@4"]["value"]
    assert 0 < p1 <= p4 <= 1 and got["all", "pass@1"]["prompts"] == 24
    # pass@1 is the plain pass rate of the samples
    rate = lake.query("SELECT avg(passed::INT) AS r FROM verdicts")["r"][0]
    assert abs(p1 - rate) < 1e-9
    assert lake.count("selections") == 0  # evaluation selects nothing
    assert "pass@4" in first.stdout

    second = subprocess.run(cmd, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert lake.count("candidates") == 24 * 4 and lake.count("evals") == 8

    # filed under another name: the same samples, judged again as a run of that name
    third = subprocess.run([*cmd, "--name", "other"], capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert lake.count("candidates") == 24 * 4 and lake.count("evals") == 16
    names = lake.query(
        "SELECT json_extract_string(config, '$.name') AS name FROM runs WHERE flow = 'evaluate'"
    )["name"].to_list()
    assert sorted(set(names)) == ["eval", "other"]


def test_the_sealed_test_split_opens_only_for_a_final_evaluation(tiny_model, tmp_path):
    """Ingested as `test`, the split is read by nothing but `thresher eval --split test
    --final`; each opening is a run, counted in the report, apart from the rounds."""
    from thresher.config import CurateConfig
    from thresher.flows.tasks import prompt_rows
    from thresher.stores.queries import SealedSplit, load_prompts

    lake = Lake(tmp_path / "lake")
    for split, name in (("eval", "train"), ("test", "eval")):
        report = ingest_arithmetic(lake, split=split, source=name)
        assert report.ingested > 0, report
    base = [sys.executable, "-m", "thresher.flows.cli", "eval", "--model", str(tiny_model)]
    base += ["--dataset", "arith", "--split", "test", "-k", "1", "--n", "2", "--limit", "8"]
    base += ["--max-tokens", "16", "--dtype", "float32", "--lake", str(lake.root)]
    base += ["--no-progress"]
    refused = subprocess.run(base, capture_output=True, text=True)
    assert refused.returncode == 2 and "sealed" in refused.stderr + refused.stdout
    assert lake.count("candidates") == 0

    # a curate config, and any stage reading prompts without opening it, is refused
    try:
        CurateConfig(name="c", model="m", prompts={"dataset": "arith", "split": "test"})
        raise AssertionError("a curate config read the test split")
    except ValueError as e:
        assert "sealed" in str(e)
    try:
        load_prompts(lake, "arith", "test")
        raise AssertionError("the test split was read without opening it")
    except SealedSplit:
        pass
    cur = CurateConfig(name="c", model="m", prompts={"dataset": "arith", "split": "eval"})
    assert len(prompt_rows(lake, cur)) > 0

    for opening in (1, 2):
        final = subprocess.run([*base, "--final"], capture_output=True, text=True)
        assert final.returncode == 0, final.stderr[-3000:]
        assert f"opened {opening} time(s)" in final.stdout
    runs = lake.query(
        "SELECT DISTINCT run_id FROM runs WHERE flow = 'evaluate' AND status = 'completed'"
    )
    assert runs.height == 2  # one run per opening
    assert lake.count("candidates") == 8 * 2  # the second opening sampled nothing new
    splits = lake.query("SELECT DISTINCT split FROM evals")["split"].to_list()
    assert splits == ["test"]

    report = subprocess.run(
        [sys.executable, "-m", "thresher.flows.cli", "report", "--lake", str(lake.root)],
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    page = (lake.root / "report" / "index.html").read_text()
    assert "Sealed test split" in page and "Opened 2 times" in page


def test_a_terminated_eval_stops_its_processes_and_resumes(tiny_model, tmp_path):
    """SIGTERM (kill, timeout, a scheduler) ends the command through its exit hooks: the
    temporary Prefect server and the engine's processes go with it, and a rerun finishes
    the work without doubling a row."""
    import psutil

    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake, split="eval")
    cmd = [sys.executable, "-m", "thresher.flows.cli", "eval", "--model", str(tiny_model)]
    cmd += ["--dataset", "arith", "-k", "1", "--n", "4", "--limit", "24", "--max-tokens", "24"]
    cmd += ["--dtype", "float32", "--lake", str(lake.root), "--no-progress"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # vLLM's default engine
    log = tmp_path / "eval.log"  # not a pipe: a process left behind would hold it open
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    server = engine = []
    while not (server and engine) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        children = _children(parent)
        server = [p for p in children if "uvicorn" in " ".join(_cmdline(p))]
        engine = [p for p in children if "EngineCore" in " ".join(_cmdline(p))]
    assert server and engine, ("no temporary Prefect server or engine", log.read_text()[-3000:])
    proc.terminate()
    proc.wait(timeout=120)
    _, alive = psutil.wait_procs(children, timeout=30)
    left = [(p.pid, _cmdline(p)) for p in alive]
    for p in alive:  # stop them before failing
        p.kill()
    assert not left, left
    assert proc.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]

    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert lake.count("candidates") == 24 * 4


def _children(proc) -> list:
    import psutil

    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:
        return []

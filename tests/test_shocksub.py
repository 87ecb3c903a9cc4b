"""shocksub: golden job scripts, the sbatch argv, hostile input, and the scripts' bash at run time.

The job scripts are also *run* here with fake `srun`/`scontrol`/`torchrun` on PATH, so quoting,
the restart bound, GPU counting and signal forwarding are checked without a Slurm cluster.
Regenerate the golden files with `SHOCKSLURM_UPDATE_GOLDEN=1 pytest tests/test_shocksub.py`,
then review the diff by eye.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.shocksub import main
from shockslurm.errors import InputError
from shockslurm.slurm.job_script import load_template, render_script
from shockslurm.slurm.submit import JobRequest, sbatch_argv

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[1]
HOSTILE_ARGS = ["$(rm -rf /)", "'", '"', ";", "a b", "`id`", "$HOME", "\\", "*", "--x", "", "&&|<>"]

SINGLE = JobRequest(job_name="resnet18-cifar", gpus=2, model="ResNet-18", epochs=30,
                    samples_per_epoch=50000, batch_sizes=(32, 64, 128), batch_size=32,
                    command=("python", "train.py", "--lr", "0.1"), partition="gpu",
                    time="4:00:00")
MULTI = JobRequest(job_name="resnet50-imagenet", gpus=4, nodes=2, model="ResNet-50", epochs=10,
                   samples_per_epoch=100000, batch_sizes=(16, 32, 64, 128), batch_size=64,
                   script="train.py", command=("--lr", "0.4"), mode="gns", template="multi_node",
                   account="teamA", qos="normal", cpus_per_gpu=8, grace_seconds=120,
                   max_restarts=10)


SPOOL = "/var/spool/shockslurm/reports"       # the site's report spool in the golden single_node
# What each golden script is rendered with: single_node with the site's spool, multi_node with
# none configured (what `shocksub --dry-run` prints without a site configuration).
GOLDEN_SPOOL = {"single_node": SPOOL, "multi_node": None}


def _render(req: JobRequest, spool: str | None = None) -> str:
    return render_script(req, load_template(req.template), spool=spool)


@pytest.fixture()
def no_site_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """shocksub finds no site configuration (SHOCKSLURM_CONFIG names a missing file)."""
    missing = tmp_path / "no-such-shockslurm.toml"
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(missing))
    monkeypatch.delenv("SHOCKSLURM_SPOOL", raising=False)
    return missing


@pytest.mark.parametrize("req", [SINGLE, MULTI], ids=["single_node", "multi_node"])
def test_golden_script(req: JobRequest) -> None:
    path = GOLDEN / f"{req.template}.sbatch"
    text = _render(req, GOLDEN_SPOOL[req.template])
    if os.environ.get("SHOCKSLURM_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_sbatch_argv() -> None:
    argv = sbatch_argv(SINGLE, "/tmp/s.sbatch")
    spec = ('{"batch_size":32,"batch_sizes":[32,64,128],"epochs":30,"mode":"static",'
            '"model":"ResNet-18","samples_per_epoch":50000}')
    assert argv == ["sbatch", "--parsable", "--job-name=resnet18-cifar", "--nodes=1",
                    "--gres=gpu:2", "--partition=gpu", "--time=4:00:00", "--output=%x-%j.out",
                    "--open-mode=append", "--requeue", "--signal=B:USR1@60",
                    f"--comment=shock:spec={spec}", "/tmp/s.sbatch"]
    multi = sbatch_argv(MULTI, "m.sbatch")
    assert "--gres=gpu:4" in multi and "--nodes=2" in multi and "--cpus-per-gpu=8" in multi
    assert "--signal=B:USR1@120" in multi and "--account=teamA" in multi
    assert not any("gres/gpu" in a for a in multi)
    comment = next(a for a in multi if a.startswith("--comment="))
    assert json.loads(comment.removeprefix("--comment=shock:spec=")) == MULTI.spec
    assert not any(c in comment for c in "\n\r\x00; ")


def test_templates_ship_as_package_data_and_top_level_link() -> None:
    for name in ("single_node", "multi_node"):
        assert (REPO / "sbatch_templates" / f"{name}.sbatch").read_text() == load_template(name)


def test_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(KeyError):
        render_script(SINGLE, "echo ${no_such_thing}\n")
    assert render_script(SINGLE, "echo $HOME ${HOME} $$ $! ${#A[@]}\n") == \
        "echo $HOME ${HOME} $$ $! ${#A[@]}\n"


@pytest.mark.parametrize("name", ["a;b", "$(id)", "a'b", 'a"b', "a\nb", "a b", "", "x" * 65,
                                  "a\x00b", "`id`"])
def test_hostile_job_name_rejected(name: str) -> None:
    with pytest.raises(InputError) as err:
        replace(SINGLE, job_name=name)
    assert err.value.field == "job_name"
    result = CliRunner().invoke(main, ["--job-name", name, "--model", "ResNet-18", "--epochs", "1",
                                       "--dry-run", "--", "true"])
    assert result.exit_code == 2
    assert "--job-name" in result.output


@pytest.mark.parametrize("changes, field", [
    ({"gpus": 0}, "gpus"), ({"gpus": 65}, "gpus"), ({"nodes": 0}, "nodes"),
    ({"command": ()}, "command"), ({"batch_sizes": (64, 32)}, "batch_sizes"),
    ({"batch_sizes": (0, 32)}, "batch_sizes"), ({"batch_sizes": (32, 32)}, "batch_sizes"),
    ({"batch_size": 48}, "batch_size"), ({"command": ("echo", "a\nb")}, "command"),
    ({"command": ("echo", "a\x00b")}, "command"), ({"nodes": 2}, "template"),
    ({"time": "4h"}, "time"), ({"output": "my log.out"}, "output"),
    ({"output": 'x"y'}, "output"), ({"partition": "gpu;rm"}, "partition"),
    ({"mode": "fast"}, "mode"), ({"model": "Res Net"}, "model"), ({"epochs": 0}, "epochs"),
    ({"grace_seconds": 0}, "grace_seconds"), ({"script": "a\nb"}, "script"),
    # surrogate-escaped bytes (a non-UTF-8 argv) would crash writing the script
    ({"command": ("python", "\udcff.py")}, "command"), ({"script": "\udcff.py"}, "script"),
    ({"output": "\udcff"}, "output"), ({"model": "\udcff"}, "model"),
    ({"job_name": "\udcff"}, "job_name"),
])
def test_validation_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        replace(SINGLE, **changes)
    assert err.value.field == field
    assert isinstance(err.value, ValueError)


def test_hostile_command_reaches_program_literally() -> None:
    req = replace(SINGLE, command=("printf", "%s\\n", *HOSTILE_ARGS))
    line = render_script(req, "${command}\n")
    subprocess.run(["bash", "-n"], input=line, text=True, check=True)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout == "".join(a + "\n" for a in HOSTILE_ARGS)


# --- running the real job scripts with fake Slurm tools ------------------------------------

FAKE_TOOLS = {
    # srun: drop its own --options, run the rest in place (exec keeps the PID for signals).
    "srun": '#!/bin/bash\nwhile [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\necho gpu01\necho gpu02\n',
    "torchrun": "#!/bin/bash\nprintf 'torchrun-arg=%s\\n' \"$@\"\n",
}


@pytest.fixture()
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in FAKE_TOOLS.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES"))}
    env["PATH"] = f"{bindir}:{env['PATH']}"
    return env


def _run_script(req: JobRequest, env: dict[str, str], tmp_path: Path,
                **extra_env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.sbatch"
    script.write_text(_render(req))
    return subprocess.run(["bash", str(script)], env={**env, **extra_env}, capture_output=True,
                          text=True, timeout=30)


def test_single_node_script_runs_hostile_command(fake_slurm: dict, tmp_path: Path) -> None:
    req = replace(SINGLE, command=("printf", "%s\\n", *HOSTILE_ARGS))
    res = _run_script(req, fake_slurm, tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("shocksub: job ? run 0")
    assert lines[1:] == HOSTILE_ARGS


def test_single_node_script_exports_spec_and_gpus(fake_slurm: dict, tmp_path: Path) -> None:
    code = ("import json, os; print(json.loads(os.environ['SHOCKSLURM_JOB_SPEC'])['model'], "
            "os.environ['SHOCKSLURM_GPUS_ON_NODE'])")
    req = replace(SINGLE, command=(sys.executable, "-c", code))
    res = _run_script(req, fake_slurm, tmp_path, CUDA_VISIBLE_DEVICES="3,4,5",
                      SLURM_GPUS="8", SLURM_GPUS_ON_NODE="3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "ResNet-18 3"
    res = _run_script(req, fake_slurm, tmp_path, SLURM_GPUS_ON_NODE="5", SLURM_GPUS="8")
    assert res.stdout.splitlines()[-1] == "ResNet-18 5"


def test_restart_bound(fake_slurm: dict, tmp_path: Path) -> None:
    req = replace(SINGLE, command=("echo", "trained"), max_restarts=3)
    res = _run_script(req, fake_slurm, tmp_path, SLURM_RESTART_COUNT="3")
    assert res.returncode == 0 and "trained" in res.stdout
    res = _run_script(req, fake_slurm, tmp_path, SLURM_RESTART_COUNT="4", SLURM_JOB_ID="77")
    assert res.returncode == 1 and "trained" not in res.stdout
    assert "job 77 was restarted 4 times (MAX_RESTARTS=3); giving up" in res.stderr


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_signal_is_forwarded_to_training(fake_slurm: dict, tmp_path: Path,
                                         sig: signal.Signals) -> None:
    ready = tmp_path / "ready"
    code = ("import signal, sys, time, pathlib\n"
            "def h(n, f):\n"
            "    print('training got', signal.Signals(n).name, flush=True)\n    sys.exit(0)\n"
            f"signal.signal(signal.{sig.name}, h)\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "time.sleep(30)\nsys.exit(3)\n")
    (tmp_path / "train.py").write_text(code)
    script = tmp_path / "job.sbatch"
    req = replace(SINGLE, command=(sys.executable, str(tmp_path / "train.py")))
    script.write_text(_render(req))
    proc = subprocess.Popen(["bash", str(script)], env=fake_slurm, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "training never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"training got {sig.name}" in out
    assert f"after SIG{sig.name.removeprefix('SIG')}" in err


def _usr1_once_ready(script: Path, env: dict, ready: Path, never: str
                     ) -> tuple[subprocess.Popen, str, str]:
    """Run the job script, send it SIGUSR1 once `ready` exists (failing with `never` if the
    script ends or 15 s pass first), touch `ready`.sent once it is sent, and return the
    finished process with its output."""
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None, never
            time.sleep(0.01)
        proc.send_signal(signal.SIGUSR1)
        ready.with_suffix(".sent").touch()
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err


def test_trainer_killed_by_the_forwarded_signal_exits_0(fake_slurm: dict,
                                                        tmp_path: Path) -> None:
    """A USR1 that reaches the trainer before it has handlers (Python still starting) kills it;
    srun then exits 138, which the script reports as a stop (0: requeued, resumed)."""
    ready = tmp_path / "ready"
    (tmp_path / "train.py").write_text(f"import pathlib, time\npathlib.Path({str(ready)!r})"
                                       ".touch()\ntime.sleep(30)\n")
    script = tmp_path / "job.sbatch"
    script.write_text(_render(replace(SINGLE, command=(sys.executable,
                                                       str(tmp_path / "train.py")))))
    proc, _, err = _usr1_once_ready(script, fake_slurm, ready, "training never started")
    assert "exited with code 138 after SIGUSR1" in err
    assert "a stop before the trainer could handle it" in err and proc.returncode == 0


def test_signal_before_training_starts_exits_0_without_training(fake_slurm: dict,
                                                                tmp_path: Path) -> None:
    """USR1 while the script is still setting up (here: in `scontrol show hostnames`) neither
    kills the shell nor is lost: training is not started, the script exits 0. The fake
    `scontrol` answers only once the signal is sent."""
    ready = tmp_path / "ready"
    sent = shlex.quote(str(ready.with_suffix(".sent")))
    (tmp_path / "bin" / "scontrol").write_text(
        f"#!/bin/bash\ntouch {shlex.quote(str(ready))}\n"
        f"for _ in $(seq 600); do [ -e {sent} ] && break; sleep 0.05; done\necho gpu01\n")
    script = tmp_path / "job.sbatch"
    script.write_text(_render(MULTI))
    proc, out, err = _usr1_once_ready(script, fake_slurm, ready, "script never started")
    assert proc.returncode == 0, err
    assert "SIGUSR1 before training started" in err and "torchrun-arg" not in out


def test_multi_node_script_runs_torchrun(fake_slurm: dict, tmp_path: Path) -> None:
    res = _run_script(MULTI, fake_slurm, tmp_path, CUDA_VISIBLE_DEVICES="0,1,2,3",
                      SLURM_NNODES="2", SLURM_JOB_ID="9", SLURM_JOB_NODELIST="gpu[01-02]")
    assert res.returncode == 0, res.stderr
    args = [l.removeprefix("torchrun-arg=") for l in res.stdout.splitlines()
            if l.startswith("torchrun-arg=")]
    assert args == ["--nnodes=2", "--nproc_per_node=4", "--rdzv_id=9", "--rdzv_backend=c10d",
                    "--rdzv_endpoint=gpu01:29500", "train.py", "--lr", "0.4"]
    cmd = replace(MULTI, script=None, command=("python", "-m", "pkg.train", "a b"))
    res = _run_script(cmd, fake_slurm, tmp_path, SLURM_GPUS_ON_NODE="2", SLURM_NNODES="2")
    args = [l.removeprefix("torchrun-arg=") for l in res.stdout.splitlines()
            if l.startswith("torchrun-arg=")]
    assert args[1] == "--nproc_per_node=2"
    assert args[5:] == ["--no-python", "python", "-m", "pkg.train", "a b"]


# --- the CLI and sbatch ---------------------------------------------------------------------

def test_cli_dry_run(tmp_path: Path, no_site_config: Path,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")   # --script must exist
    result = CliRunner().invoke(main, [
        "--nodes", "2", "--gpus", "4", "--model", "ResNet-50", "--epochs", "10",
        "--batch-sizes", "16,32,64,128", "--batch-size", "64", "--samples-per-epoch", "100000",
        "--mode", "gns", "--job-name", "resnet50-imagenet", "--account", "teamA", "--qos", "normal",
        "--cpus-per-gpu", "8", "--grace-seconds", "120", "--max-restarts", "10",
        "--script-dir", str(tmp_path / "scripts"), "--script", "train.py", "--dry-run",
        "--", "--lr", "0.4"])
    assert result.exit_code == 0, result.output
    script, _, call = result.output.partition("# sbatch call:\n")
    assert script == (GOLDEN / "multi_node.sbatch").read_text()
    argv = shlex.split(call)
    assert argv[:-1] == sbatch_argv(MULTI, "x")[:-1]
    assert argv[-1].startswith(str(tmp_path / "scripts" / "resnet50-imagenet-"))
    assert not (tmp_path / "scripts").exists()


def test_cli_catalogue_defaults_and_trailing_command() -> None:
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--dry-run",
                                       "python", "train.py", "--lr", "0.1"])
    assert result.exit_code == 0, result.output
    assert "srun --ntasks=1 --kill-on-bad-exit=1 python train.py --lr 0.1 &" in result.output
    assert '"batch_sizes":[16,32,64,128,256]' in result.output
    assert "--job-name=shock-ResNet-18" in result.output


@pytest.mark.parametrize("args, option", [
    (["--gpus", "0"], "--gpus"), (["--gpus", "65"], "--gpus"), (["--nodes", "0"], "--nodes"),
    (["--batch-sizes", "64,32"], "--batch-sizes"), (["--batch-sizes", "a,b"], "--batch-sizes"),
    (["--batch-size", "48"], "--batch-size"), (["--template", "single_node", "--nodes", "2"],
                                               "--template"),
    (["--time", "soon"], "--time"),
    # until 2026-12-02 accepted: a job no cluster could hold, a spec no daemon would find
    (["--nodes", "99999999999"], "--nodes"), (["--gpus", "8", "--nodes", "12501"], "--nodes"),
    (["--cluster", ""], "--cluster"), (["--cluster", "a\nb"], "--cluster"),
    (["--cluster", "x" * 65], "--cluster"),
])
def test_cli_bad_input_exits_2_naming_option(args: list[str], option: str) -> None:
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", *args,
                                       "--dry-run", "--", "true"])
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output


def test_cli_missing_command_and_unknown_model() -> None:
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--dry-run"])
    assert result.exit_code == 2 and "COMMAND" in result.output
    result = CliRunner().invoke(main, ["--model", "MyNet", "--epochs", "1", "--dry-run", "true"])
    assert result.exit_code == 2 and "give --samples-per-epoch" in result.output
    assert "Invalid value for '--model'" in result.output     # not the option never given


# --- the site's report spool reaches the job -------------------------------------------------

HOSTILE_SPOOL = "sp ool'$(touch pwned)`id`}\"\\x"     # a directory name bash must not interpret


def _site_config(tmp_path: Path, spool: str) -> Path:
    path = tmp_path / "shockslurm.toml"
    path.write_text(f"[daemon]\nspool_dir = {json.dumps(spool)}\n")
    return path


def _dry_run_script(env: dict[str, str], *command: str) -> tuple[str, str]:
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--dry-run",
                                       "--", *command], env=env)
    assert result.exit_code == 0, result.output
    return result.stdout.partition("# sbatch call:\n")[0], result.stderr


def test_site_spool_is_exported_to_the_job(fake_slurm: dict, tmp_path: Path) -> None:
    spool = str(tmp_path / HOSTILE_SPOOL)
    config = _site_config(tmp_path, spool)
    show = "import os; print(os.environ['SHOCKSLURM_SPOOL'])"
    text, err = _dry_run_script({"SHOCKSLURM_CONFIG": str(config), "SHOCKSLURM_SPOOL": None},
                                sys.executable, "-c", show)
    assert err == ""
    assert f"SHOCK_SITE_SPOOL={shlex.quote(spool)}\n" in text
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {k: v for k, v in fake_slurm.items() if k != "SHOCKSLURM_SPOOL"}
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == spool            # literally, nothing interpreted
    assert not (tmp_path / "pwned").exists()
    # a spool the job's environment names wins over the site's
    res = subprocess.run(["bash", str(script)], env={**env, "SHOCKSLURM_SPOOL": "/elsewhere"},
                         capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert res.stdout.splitlines()[-1] == "/elsewhere"


@pytest.mark.parametrize("content, said", [
    ('[daemon]\nspool_dir = "relative/spool"\n', "field 'daemon.spool_dir': must be an absolute"),
    ('[daemon]\nspool_dir = 5\n', "field 'daemon.spool_dir': must be a string"),
    ('[daemon]\nspool_dir = "/a\\nb"\n', "must not contain control characters"),
    ("[daemon\n", "not valid TOML"),
])
def test_unusable_site_config_is_said_and_the_job_still_submitted(
        tmp_path: Path, content: str, said: str) -> None:
    config = tmp_path / "shockslurm.toml"
    config.write_text(content)
    text, err = _dry_run_script({"SHOCKSLURM_CONFIG": str(config)}, "true")
    assert err.startswith(f"shocksub: no report spool for the job: {config}") and said in err
    assert "# No report spool was configured at submission" in text
    assert "SHOCKSLURM_SPOOL" not in text


def test_no_spool_in_the_site_config(tmp_path: Path) -> None:
    config = tmp_path / "shockslurm.toml"
    config.write_text('[daemon]\nround_seconds = 60\n')
    text, err = _dry_run_script({"SHOCKSLURM_CONFIG": str(config)}, "true")
    assert err == "" and "SHOCKSLURM_SPOOL" not in text


def test_shocksub_imports_no_sqlalchemy_numpy_or_policies() -> None:
    """shocksub stays fast: reading the site configuration is a TOML parse, nothing more."""
    code = ("import sys, shockslurm.cli.shocksub; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'numpy'}), "
            "'shockslurm.policies' in sys.modules, 'shockslurm.ops.config' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[] False False"

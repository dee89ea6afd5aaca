"""tftrt-serve's command line: TF Serving's flags, config files, and a real process serving until SIGTERM."""
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from conftest import reference
from support import REPO, random_array, subprocess_env
from tftrt_py.serving import cli
from tftrt_py.serving.config import BatchingOptions, ModelSpec, VersionPolicy
from tftrt_py.tools.cli import ToolError


def parse(*argv):
    return cli.server_from_args(cli.build_parser().parse_args(list(argv)))


def test_single_model_flags():
    server = parse("--port=8600", "--rest_api_port=8601", "--model_name=cnn", "--model_base_path=/models/cnn")
    assert server.models == [ModelSpec("cnn", "/models/cnn")]
    assert (server.grpc_port, server.rest_port, server.batching) == (8600, 8601, None)


def test_rest_port_zero_leaves_rest_off_and_model_name_defaults():
    server = parse("--model_base_path=/m")
    assert (server.grpc_port, server.rest_port) == (8500, None) and server.models[0].name == "default"


def test_config_files(tmp_path):
    config, batching = tmp_path / "models.config", tmp_path / "batching.config"
    config.write_text('model_config_list { config { name: "a" base_path: "/a" model_version_policy { all {} } } '
                      'config { name: "b" base_path: "/b" } }')
    batching.write_text("max_batch_size { value: 16 } batch_timeout_micros { value: 1000 } "
                        "num_batch_threads { value: 2 } allowed_batch_sizes: 8 allowed_batch_sizes: 16")
    server = parse(f"--model_config_file={config}", "--enable_batching=true",
                   f"--batching_parameters_file={batching}", "--rest_api_timeout_in_ms=5000")
    assert server.models == [ModelSpec("a", "/a", VersionPolicy("all")), ModelSpec("b", "/b")]
    assert server.batching == BatchingOptions(max_batch_size=16, batch_timeout_micros=1000, num_batch_threads=2,
                                              allowed_batch_sizes=(8, 16))
    assert parse("--model_base_path=/m", "--enable_batching").batching.max_batch_size == 1000
    assert parse("--model_base_path=/m", f"--batching_parameters_file={batching}").batching is None


def test_file_system_poll_wait_seconds_sets_the_poll_interval():
    assert parse("--model_base_path=/m").file_system_poll_wait_seconds == 1  # TF Serving's default
    assert parse("--model_base_path=/m", "--file_system_poll_wait_seconds=30").file_system_poll_wait_seconds == 30
    assert parse("--model_base_path=/m", "--file_system_poll_wait_seconds=0").file_system_poll_wait_seconds == 0
    for bad in ("-1", "0.5", "soon"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args([f"--file_system_poll_wait_seconds={bad}"])


def test_bad_command_lines():
    with pytest.raises(ToolError, match="--model_base_path"):
        parse("--port=1")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--enable_batching=maybe"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--no_such_flag=1"])


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tftrt_serve_process_serves_until_sigterm(models):
    port = _free_port()
    command = [sys.executable, "-m", "tftrt_py.serving.cli", "--host=127.0.0.1", "--port=0",
               f"--rest_api_port={port}", "--model_name=mlp", f"--model_base_path={os.path.join(models.root, 'mlp')}",
               "--enable_batching"]
    proc = subprocess.Popen(command, env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving mlp" in line and f"REST on 127.0.0.1:{port}" in line, proc.stderr.read() if not line else line
        x = random_array((2, 16))
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/mlp:predict",
                                         data=json.dumps({"instances": x.tolist()}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        np.testing.assert_allclose([row["logits"] for row in body["predictions"]],
                                   reference(models, "mlp", 2, features=x)["logits"], rtol=1e-5, atol=1e-5)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0


def test_sigterm_taken_by_another_thread_still_stops_the_server(models):
    """The kernel may deliver SIGTERM to any thread that does not block it; here the main thread blocks it, so a
    thread of the process other than the one serving takes it."""
    script = (
        "import signal, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "from tftrt_py.serving import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    command = [sys.executable, "-c", script, "--host=127.0.0.1", "--port=0", "--rest_api_port=0",
               "--model_name=mlp", f"--model_base_path={os.path.join(models.root, 'mlp')}"]
    proc = subprocess.Popen(command, env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving mlp" in line, proc.stderr.read() if not line else line
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0

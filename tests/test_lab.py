"""A real Jupyter server from .venv, not nbclient in-process: `make lab` registers the `litm` kernel and starts
JupyterLab on notebooks/ (checked through the server's HTTP API), and notebook 00's config and first cells run
in that kernel through the server's REST API and kernel websocket."""
import asyncio
import datetime
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` with its Jupyter folders in a temporary place, on a free port with a token."""
    tmp = tmp_path_factory.mktemp("jupyter")
    port, token = _free_port(), uuid.uuid4().hex
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp / "data"), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    args = f"--no-browser --port={port} --ServerApp.token={token} --ServerApp.ip=127.0.0.1"
    log = open(tmp / "lab.log", "w")
    proc = subprocess.Popen(["make", "-C", str(ROOT), "lab", f"LAB_ARGS={args}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(180):
            if proc.poll() is not None:
                pytest.fail(f"make lab exited with {proc.returncode}:\n{(tmp / 'lab.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"JupyterLab did not answer within 90 s:\n{(tmp / 'lab.log').read_text()[-3000:]}")
        yield base, token, tmp
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()


def _get(base, token, path):
    with urllib.request.urlopen(f"{base}{path}{'&' if '?' in path else '?'}token={token}", timeout=10) as r:
        return r.status, r.read().decode()


def test_make_lab_serves_jupyterlab_on_the_notebooks_with_the_litm_kernel(lab):
    base, token, _ = lab
    status, page = _get(base, token, "/lab")
    assert status == 200 and "JupyterLab" in page
    specs = json.loads(_get(base, token, "/api/kernelspecs")[1])["kernelspecs"]
    assert "litm" in specs, f"kernels: {sorted(specs)}"
    python = Path(specs["litm"]["spec"]["argv"][0])
    assert python.parent == (ROOT / ".venv" / "bin"), python  # .venv's interpreter, registered by make lab
    listing = json.loads(_get(base, token, "/api/contents")[1])["content"]
    names = {c["name"] for c in listing}
    assert "00-tour-move-the-answer.ipynb" in names and "08-interventions-inside-the-model.ipynb" in names


def _message(code: str, session: str) -> dict:
    return {"header": {"msg_id": uuid.uuid4().hex, "username": "test", "session": session, "msg_type": "execute_request",
                       "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}


async def _run_cells(url: str, cells: list[str], timeout: float) -> list[dict]:
    """Execute `cells` in turn on a kernel's websocket; each cell's status, outputs and error."""
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(url)
    session, results = uuid.uuid4().hex, []
    try:
        for code in cells:
            msg = _message(code, session)
            await ws.write_message(json.dumps(msg))
            outputs, status, error, idle = [], None, None, False
            deadline = time.monotonic() + timeout
            # the reply (shell) and the outputs (iopub) travel on different channels: a cell is done when both its
            # execute_reply and its iopub `idle` status have arrived, in whichever order
            while status is None or not idle:
                raw = await asyncio.wait_for(ws.read_message(), max(1.0, deadline - time.monotonic()))
                reply = json.loads(raw)
                if reply.get("parent_header", {}).get("msg_id") != msg["header"]["msg_id"]:
                    continue
                kind = reply["msg_type"]
                if kind in ("stream", "execute_result", "display_data"):
                    outputs.append(reply["content"])
                elif kind == "error":
                    error = "\n".join(reply["content"]["traceback"])
                elif kind == "execute_reply":
                    status = reply["content"]["status"]
                elif kind == "status" and reply["content"]["execution_state"] == "idle":
                    idle = True
            results.append({"status": status, "outputs": outputs, "error": error})
            if status != "ok":
                break
    finally:
        ws.close()
    return results


def test_notebook_cells_run_in_the_litm_kernel_through_the_server(lab):
    base, token, _ = lab
    req = urllib.request.Request(f"{base}/api/kernels?token={token}", data=json.dumps({"name": "litm"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        kernel = json.loads(r.read())
    url = base.replace("http", "ws") + f"/api/kernels/{kernel['id']}/channels?token={token}"
    probe = "import litm, pathlib\nprint(pathlib.Path(litm.__file__).resolve())"
    (first,) = asyncio.run(_run_cells(url, [probe], timeout=60))
    assert first["status"] == "ok", ("the litm kernel cannot import litm (run `make lab`, or `pip install -e .` in "
                                     f"the kernel's environment):\n{first['error']}")
    assert first["outputs"][0]["text"].strip().startswith(str(ROOT / "lib" / "litm")), first["outputs"]
    nb = json.loads((ROOT / "notebooks" / "00-tour-move-the-answer.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    config = code[0] + "\nQUESTIONS = 2\n"
    results = asyncio.run(_run_cells(url, [config, code[1]], timeout=240))
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    # the explorer: its widget and the HTML fallback (a progress bar may be displayed after it on a busy machine)
    shown = next(o["data"] for o in reversed(results[1]["outputs"]) if "text/html" in o.get("data", {}))
    assert "application/vnd.jupyter.widget-view+json" in shown and "gold document at position" in shown["text/html"]

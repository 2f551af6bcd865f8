"""kvtier behind vLLM's OpenAI HTTP server, two clients at once.

Starts a real kvtierd and `python -m vllm.entrypoints.openai.api_server`
with the exact --kv-transfer-config the README shows; two client threads
send completions (token-id prompts, greedy, token ids returned) at the same
time, twice: the cold round saves, the warm round loads; every answer must
equal what the engine computes with kvtier off (tests/engines/vllm_run.py).
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from kvtd import Daemon, Results, _die_with_parent  # noqa: E402
from test_vllm import CT, MODEL, run, stats_of, toks  # noqa: E402

R = Results()
PROMPTS = [toks(31, 3 * CT + 17), toks(32, 2 * CT + 100)]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, body, timeout=300):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve(d, stats):
    port = free_port()
    ktc = {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
           "kv_connector_extra_config": {"socket": d.url, "chunk_tokens": CT,
                                         "stats_file": stats}}
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               PYTHONHASHSEED="0",
               PYTHONPATH=os.path.join(HERE, "..", "..", "client", "python"))
    log = open(os.path.join(d.dir, "server.log"), "wb")
    p = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                          "--model", MODEL, "--port", str(port), "--host", "127.0.0.1",
                          "--enforce-eager", "--no-enable-prefix-caching",
                          "--dtype", "float32", "--max-model-len", "4096", "--seed", "0",
                          "--kv-transfer-config", json.dumps(ktc)],
                         stdout=log, stderr=log, env=env, preexec_fn=_die_with_parent)
    t0 = time.time()
    while time.time() - t0 < 300:
        if p.poll() is not None:
            raise AssertionError("server exited:\n" + open(log.name, errors="replace").read()[-4000:])
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2)
            return p, port
        except Exception:
            time.sleep(0.5)
    p.kill()
    raise AssertionError("server did not come up")


def two_clients(port):
    out, errs = [None, None], []

    def one(i):
        try:
            r = post(port, {"model": MODEL, "prompt": PROMPTS[i], "max_tokens": 8,
                            "temperature": 0.0, "ignore_eos": True,
                            "return_token_ids": True})
            out[i] = r["choices"][0]["token_ids"]
        except Exception as e:  # reported below
            errs.append(e)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return out


def test_http_two_clients(d):
    ref = run([{"prompt": p} for p in PROMPTS])
    stats = os.path.join(d.dir, "stats-http")
    p, port = serve(d, stats)
    try:
        cold = two_clients(port)
        assert cold == ref, (cold, ref)
        # the saves run beside the engine: the warm round starts once the
        # daemon holds the 3 + 2 chunks the prompts have
        t0 = time.time()
        while json.loads(d.ctl("stats", "--json").stdout)["chunks"] < 5:
            assert time.time() - t0 < 60, "cold saves never arrived"
            time.sleep(0.1)
        warm = two_clients(port)
        assert warm == ref, (warm, ref)
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    s = stats_of(stats, "scheduler")
    assert s["hit_tokens"] == (3 + 2) * CT, s


def main():
    with Daemon(pool="256M") as d:
        R.run(test_http_two_clients, d)
    R.finish()


if __name__ == "__main__":
    main()

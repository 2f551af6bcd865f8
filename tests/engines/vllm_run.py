"""Run prompts through a real vLLM (offline LLM API) and print the tokens.

Design: one engine per process (the tests start several configurations:
kvtier off, cold, warm, after a restart...), everything set from one JSON
argument so the test controls exactly what the engine sees. Prints one
JSON line: {"outputs": [[token ids] per request], "ttft_s": [...]} and
leaves the connector's counters in stats_file.*.json when kvtier is on.

    python vllm_run.py @FILE | '{"model": DIR, "max_tokens": 8, "policy": "recompute",
                         "kvtier": {extra config} | null,
                         "steps": [{"prompt": [ids]} | {"chat": [[ids]...]}
                                   | {"sh": "command"}]}'
"""
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("PYTHONHASHSEED", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))


def main():
    arg = sys.argv[1]
    if arg.startswith("@"):                 # long prompts: the JSON in a file
        with open(arg[1:]) as f:
            arg = f.read()
    a = json.loads(arg)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=a["model"], enforce_eager=True, enable_prefix_caching=False,
              max_model_len=a.get("max_model_len", 4096), dtype="float32",
              seed=0,
              max_num_batched_tokens=a.get("max_num_batched_tokens", 4096),
              gpu_memory_utilization=0.5)
    if a.get("block_size"):
        kw["block_size"] = a["block_size"]
    if a.get("hash_algo"):                  # sha256_cbor: kvtier's vllm scheme
        kw["prefix_caching_hash_algo"] = a["hash_algo"]
    if a.get("kv_offloading_size"):          # vLLM's own CPU offloading
        kw["kv_offloading_size"] = a["kv_offloading_size"]
    if a.get("kvtier") is not None:
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KVTierConnector", kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both", kv_load_failure_policy=a.get("policy", "recompute"),
            kv_connector_extra_config=a["kvtier"])
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=a.get("max_tokens", 8), ignore_eos=True)
    outs, ttft, finish = [], [], []

    def gen(ids):
        t0 = time.perf_counter()
        res = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
        ttft.append(time.perf_counter() - t0)
        out = list(res[0].outputs[0].token_ids)
        outs.append(out)
        if a.get("drain") and a.get("kvtier") is not None:
            # exact hit counts in tests: this request's saves are in kvtier
            # before the next request looks up
            from vllm.distributed.kv_transfer import get_kv_transfer_group
            mover = get_kv_transfer_group().mover
            if mover is not None:
                assert mover.wait_idle(60), "saves did not finish"
        finish.append(res[0].outputs[0].finish_reason)
        return out

    for st in a["steps"]:
        if "prompt" in st:                  # one request
            gen(st["prompt"])
        elif "chat" in st:                  # turns: history + reply + next segment
            hist = []
            for seg in st["chat"]:
                hist = hist + seg
                hist = hist + gen(hist)
        elif "sh" in st:                    # the test acts between requests
            subprocess.run(st["sh"], shell=True, check=True)
    if a.get("kvtier") is not None:     # saves still running end here
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        get_kv_transfer_group().shutdown()
    bs = llm.llm_engine.vllm_config.cache_config.block_size
    print(json.dumps({"outputs": outs, "ttft_s": ttft, "block_size": bs,
                      "finish": finish}))
    sys.stdout.flush()
    os._exit(0)   # skip engine teardown: the test only needs the tokens


if __name__ == "__main__":
    main()

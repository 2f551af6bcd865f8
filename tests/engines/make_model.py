"""Make a tiny random-weight Llama for the engine tests and benchmarks.

Design: engines load a model directory from disk (no hub): config.json,
safetensors weights and a word-level tokenizer whose vocabulary is
"w0".."w{V-1}", so a prompt is just words and every token id is known.
Weights come from a fixed seed, so every run -- and kvtier on or off --
computes the same logits. Sizes are arguments: the default is small enough
for the tests (hidden 256, 4 layers, 4 heads, 2 KV heads); the benchmark
asks for a bigger one whose prefill of 4k tokens takes seconds.

    python make_model.py OUT_DIR [--hidden 256 --layers 4 --heads 4
                                   --kv-heads 2 --vocab 2000 --ctx 8192]
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    stamp = os.path.join(a.out, ".kvtier-model")
    want = json.dumps(vars(a), sort_keys=True)
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for i in range(a.vocab - len(specials)):
        vocab["w%d" % i] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(a.out)
    cfg = LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      intermediate_size=a.intermediate or 2 * a.hidden,
                      vocab_size=a.vocab, max_position_embeddings=a.ctx,
                      bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(a.out, safe_serialization=True)
    with open(stamp, "w") as f:
        f.write(want)


if __name__ == "__main__":
    main()

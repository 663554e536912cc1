# vLLM from PyPI, unmodified, on a tiny model built from a config with dummy weights (no
# download): starts an engine at one gpu_memory_utilization, optionally generates, and
# optionally holds the engine until stdin closes. vLLM's own log goes to stdout/stderr as
# usual; this script's results are lines starting with "@@ " followed by JSON, so a test can
# read both from one stream.
#
#   vllm_probe.py --model-dir DIR --util 0.8 [--generate N] [--sleep-mode] [--hold]
#
# "@@ {"ready": ...}" once the engine is up (or "@@ {"error": ..., "msg": ...}" and exit 3
# when vLLM refuses to start), "@@ {"tokens": [...]}" after generate(). With --sleep-mode the
# engine allocates through vLLM's CuMemAllocator (cuMemCreate/cuMemMap), says
# "@@ {"sleepy": true}" and waits for a line on stdin (so the card can be read after
# generate() and before the sleep), then sleeps (level 1: weights to the host, the KV cache
# discarded), says "@@ {"asleep": true}", waits for a line on stdin, wakes up and says
# "@@ {"awake": true}". "@@ {"holding": true}" while it
# waits for stdin to close.
import argparse
import json
import os
import sys


def say(obj):
    print("@@ " + json.dumps(obj), flush=True)


# A two-layer Llama small enough that weights and activations are noise next to the KV cache.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--util", type=float, required=True)
    p.add_argument("--generate", type=int, default=0)
    p.add_argument("--sleep-mode", action="store_true")
    p.add_argument("--hold", action="store_true")
    a = p.parse_args()

    os.makedirs(a.model_dir, exist_ok=True)
    with open(os.path.join(a.model_dir, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)

    from vllm import LLM, SamplingParams

    try:
        llm = LLM(
            model=a.model_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            gpu_memory_utilization=a.util,
            max_model_len=128,
            # Eager mode: no torch.compile and no CUDA graph capture, which would cost
            # minutes of CPU on a small machine and are not what these tests look at.
            enforce_eager=True,
            dtype="float16",
            enable_sleep_mode=a.sleep_mode,
        )
    except Exception as e:  # vLLM's own refusal is a result, not a crash of the probe
        say({"error": type(e).__name__, "msg": str(e)})
        sys.exit(3)
    say({"ready": True})

    if a.generate:
        params = SamplingParams(max_tokens=a.generate, detokenize=False, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": [1, 5, 7, 9]}], params, use_tqdm=False)
        say({"tokens": list(out[0].outputs[0].token_ids)})

    if a.sleep_mode:
        say({"sleepy": True})
        sys.stdin.readline()
        llm.sleep(level=1)
        say({"asleep": True})
        sys.stdin.readline()
        llm.wake_up()
        say({"awake": True})

    if a.hold:
        say({"holding": True})
        sys.stdin.read()
    say({"done": True})


main()

"""Many model families, compiled with tritonfuse and checked against eager: what a new user
tries first. Each family is built from a small config of its own (random weights, two
layers), run for inference and for a training step (loss and every gradient), in float32,
compiled and eagerly on the same inputs.

    python scripts/wide_models_check.py                          # every family, cuda if present
    python scripts/wide_models_check.py qwen2,opt,bart --modes train --time-limit 500
    WIDE_CHECK_DEVICE=cpu python scripts/wide_models_check.py --list

Per (family, mode): the relative L2 error of the output and of the worst parameter
gradient against eager, graphs run eagerly, Dynamo graphs and breaks, kernels made, the
aten ops left as fallbacks, first-call seconds, or the exception. A row fails when an error
exceeds ``--tolerance`` (float32: 1e-4), when a graph ran eagerly, or when anything raised.
Results go to ``$OUT/wide_check.json`` (or ``--out``) after every row, and a table to stdout.
Families whose config class this transformers lacks are skipped and listed.
"""
import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

# family -> (config class, Auto model class, config keywords, inputs)
TEXT = dict(vocab_size=1000, pad_token_id=0, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=256)
DECODER_KV = dict(TEXT, num_key_value_heads=2)
ENC_DEC = dict(vocab_size=1000, pad_token_id=0, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=256,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
VISION = dict(image_size=32, num_channels=3, num_labels=10)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

FAMILIES = {
    "qwen2": ("Qwen2Config", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "qwen3": ("Qwen3Config", "AutoModelForCausalLM", dict(DECODER_KV, head_dim=32), "causal"),
    "phi3": ("Phi3Config", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "phi": ("PhiConfig", "AutoModelForCausalLM", dict(TEXT, resid_pdrop=0.0, embd_pdrop=0.0), "causal"),
    "gemma": ("GemmaConfig", "AutoModelForCausalLM", dict(DECODER_KV, head_dim=32), "causal"),
    "gemma2": ("Gemma2Config", "AutoModelForCausalLM", dict(DECODER_KV, head_dim=32, sliding_window=32), "causal"),
    "olmo2": ("Olmo2Config", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "stablelm": ("StableLmConfig", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "starcoder2": ("Starcoder2Config", "AutoModelForCausalLM", dict(DECODER_KV, residual_dropout=0.0), "causal"),
    "mixtral": ("MixtralConfig", "AutoModelForCausalLM", dict(DECODER_KV, num_local_experts=4,
                                                              num_experts_per_tok=2), "causal"),
    "gpt_neox": ("GPTNeoXConfig", "AutoModelForCausalLM", dict(TEXT, hidden_dropout=0.0, attention_dropout=0.0),
                 "causal"),
    "opt": ("OPTConfig", "AutoModelForCausalLM", dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                     num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=128,
                                                     max_position_embeddings=256, dropout=0.0), "causal"),
    "bloom": ("BloomConfig", "AutoModelForCausalLM", dict(vocab_size=1000, hidden_size=128, n_layer=2, n_head=4,
                                                         hidden_dropout=0.0, attention_dropout=0.0), "causal"),
    "falcon": ("FalconConfig", "AutoModelForCausalLM", dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                           num_attention_heads=4, hidden_dropout=0.0,
                                                           attention_dropout=0.0), "causal"),
    "gptj": ("GPTJConfig", "AutoModelForCausalLM", dict(vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                                                       rotary_dim=16, n_positions=256, resid_pdrop=0.0,
                                                       embd_pdrop=0.0, attn_pdrop=0.0), "causal"),
    "roberta": ("RobertaConfig", "AutoModelForMaskedLM", dict(TEXT, **NO_DROPOUT, max_position_embeddings=258),
                "masked"),
    "electra": ("ElectraConfig", "AutoModelForMaskedLM", dict(TEXT, embedding_size=64, **NO_DROPOUT), "masked"),
    "albert": ("AlbertConfig", "AutoModelForMaskedLM", dict(TEXT, embedding_size=64, hidden_dropout_prob=0.0,
                                                           attention_probs_dropout_prob=0.0), "masked"),
    "deberta_v2": ("DebertaV2Config", "AutoModelForMaskedLM", dict(TEXT, **NO_DROPOUT, relative_attention=True,
                                                                   pos_att_type=["p2c", "c2p"]), "masked"),
    "modernbert": ("ModernBertConfig", "AutoModelForMaskedLM", dict(TEXT, global_attn_every_n_layers=2,
                                                                    local_attention=32), "masked"),
    "bart": ("BartConfig", "AutoModelForSeq2SeqLM", ENC_DEC, "seq2seq"),
    "marian": ("MarianConfig", "AutoModelForSeq2SeqLM", dict(ENC_DEC, decoder_vocab_size=1000, pad_token_id=0,
                                                            decoder_start_token_id=0), "seq2seq"),
    "whisper": ("WhisperConfig", "AutoModelForSpeechSeq2Seq", dict(ENC_DEC, num_mel_bins=16,
                                                                  max_source_positions=32,
                                                                  max_target_positions=64, decoder_start_token_id=1),
                "speech"),
    "swin": ("SwinConfig", "AutoModelForImageClassification", dict(VISION, patch_size=2, embed_dim=32,
                                                                  depths=[2, 2], num_heads=[2, 4], window_size=4,
                                                                  hidden_dropout_prob=0.0, drop_path_rate=0.0,
                                                                  attention_probs_dropout_prob=0.0), "image"),
    "convnext_hf": ("ConvNextConfig", "AutoModelForImageClassification", dict(VISION, hidden_sizes=[16, 32],
                                                                             depths=[1, 1], num_stages=2),
                    "image"),
    "dinov2": ("Dinov2Config", "AutoModelForImageClassification", dict(VISION, patch_size=4, hidden_size=64,
                                                                      num_hidden_layers=2, num_attention_heads=4,
                                                                      intermediate_size=128, **NO_DROPOUT),
               "image"),
    "beit": ("BeitConfig", "AutoModelForImageClassification", dict(VISION, patch_size=4, hidden_size=64,
                                                                  num_hidden_layers=2, num_attention_heads=4,
                                                                  intermediate_size=128, **NO_DROPOUT,
                                                                  use_relative_position_bias=True, drop_path_rate=0.0), "image"),
    "segformer": ("SegformerConfig", "AutoModelForImageClassification", dict(VISION, num_encoder_blocks=2,
                                                                            depths=[1, 1], sr_ratios=[2, 1],
                                                                            hidden_sizes=[16, 32],
                                                                            patch_sizes=[3, 3], strides=[2, 2],
                                                                            num_attention_heads=[1, 2],
                                                                            mlp_ratios=[2, 2],
                                                                            hidden_dropout_prob=0.0,
                                                                            attention_probs_dropout_prob=0.0,
                                                                            classifier_dropout_prob=0.0,
                                                                            drop_path_rate=0.0), "image"),
}


def build(family: str, device):
    import transformers
    config_name, auto_name, kwargs, inputs = FAMILIES[family]
    config_cls = getattr(transformers, config_name, None)
    if config_cls is None:
        return None, inputs
    config = config_cls(**kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, auto_name).from_config(config)
    return model.to(device, torch.float32), inputs


def make_batch(inputs: str, device, batch=2, length=48):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (batch, length), generator=g).to(device)
    if inputs in ("causal", "masked"):
        return dict(input_ids=ids, labels=ids)
    if inputs == "seq2seq":
        return dict(input_ids=ids, labels=ids[:, : length // 2].contiguous())
    if inputs == "speech":
        features = torch.randn(batch, 16, 64, generator=g).to(device)
        return dict(input_features=features, labels=ids[:, :16].contiguous())
    pixels = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    return dict(pixel_values=pixels, labels=torch.randint(0, 10, (batch,), generator=g).to(device))


def run(model, batch: dict, train: bool):
    if train:
        out = model(**batch)
        out.loss.backward()
        grads = {n.removeprefix("_orig_mod."): p.grad.detach().clone()
                 for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out.loss.detach(), grads
    with torch.no_grad():   # labels too: encoder-decoders take their decoder inputs from them
        out = model(**batch)
    return out.logits.detach(), {}


def gradient_scale(grads: dict) -> float:
    """The root mean square of every gradient entry: the floor of a gradient's norm in
    ``grad_error`` (a gradient that is zero in exact arithmetic, as a key projection's bias
    under softmax, is rounding noise in eager and compiled alike)."""
    total = sum(g.double().pow(2).sum().item() for g in grads.values())
    count = sum(g.numel() for g in grads.values())
    return (total / max(count, 1)) ** 0.5


def grad_error(ref: torch.Tensor, got: torch.Tensor, scale: float) -> float:
    """||got - ref|| / max(||ref||, 1e-3 * scale * sqrt(numel)): relative L2 error, measured
    against the model's typical gradient size where this gradient is near zero."""
    diff = (ref.double() - got.double()).norm().item()
    return diff / max(ref.double().norm().item(), 1e-3 * scale * ref.numel() ** 0.5, 1e-30)


def rel_l2(ref: torch.Tensor, got: torch.Tensor) -> float:
    return grad_error(ref, got, 0.0)


def check(family: str, train: bool, device, tolerance: float) -> dict:
    import tritonfuse
    model, inputs = build(family, device)
    if model is None:
        return dict(status="skipped", reason="this transformers has no " + FAMILIES[family][0])
    model.train(train)
    batch = make_batch(inputs, device)
    ref, ref_grads = run(model, batch, train)
    tritonfuse.metrics.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="tritonfuse")
    start = time.perf_counter()
    got, grads = run(compiled, batch, train)
    first_s = time.perf_counter() - start
    got2, grads2 = run(compiled, batch, train)   # a second call: cached graphs, donated buffers
    errors = dict(output=max(rel_l2(ref, got), rel_l2(ref, got2)))
    if train:
        missing = sorted(set(ref_grads) ^ set(grads))
        if missing:
            errors["missing_grads"] = float("inf")
        floor = gradient_scale(ref_grads)
        worst = max((max(grad_error(ref_grads[n], grads[n], floor), grad_error(ref_grads[n], grads2[n], floor)), n)
                    for n in ref_grads if n in grads)
        errors["worst_grad"], errors["worst_grad_name"] = worst
    metrics = tritonfuse.metrics
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    row = dict(status="ok", first_s=round(first_s, 1), eager_graphs=metrics.eager_graphs,
               eager_reasons=dict(metrics.eager_graph_reasons), graph_breaks=breaks,
               kernels=metrics.generated_kernel_count, fallbacks=sorted(metrics.fallbacks), **errors)
    bad = [k for k in ("output", "worst_grad") if isinstance(row.get(k), float) and not row[k] <= tolerance]
    if bad or row["eager_graphs"] or "missing_grads" in row:
        row["status"] = "FAIL"
        row["why"] = ", ".join(bad + (["eager graphs"] if row["eager_graphs"] else [])
                               + (["missing grads"] if "missing_grads" in row else []))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("families", nargs="?", default="all", help="comma-separated, or all")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--time-limit", type=float, default=None, help="seconds: start no row after this")
    p.add_argument("--out", default=None)
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        print(" ".join(FAMILIES))
        return 0
    families = list(FAMILIES) if args.families == "all" else args.families.split(",")
    device = torch.device(os.environ.get("WIDE_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    out = Path(args.out or os.environ.get("OUT", ".")) / "wide_check.json"
    results, start = {}, time.perf_counter()
    for family in families:
        for mode in args.modes.split(","):
            if args.time_limit and time.perf_counter() - start > args.time_limit:
                results[f"{family}-{mode}"] = dict(status="not run", reason="time limit")
                continue
            try:
                row = check(family, mode == "train", device, args.tolerance)
            except Exception as error:  # a crash is a finding: record it and go on
                row = dict(status="FAIL", why="raised", error=f"{type(error).__name__}: {error}"[:2000],
                           traceback=traceback.format_exc()[-4000:])
            results[f"{family}-{mode}"] = row
            print(f"{family:12s} {mode:5s} " + json.dumps({k: v for k, v in row.items() if k != "traceback"}),
                  flush=True)
            out.write_text(json.dumps(dict(device=str(device), torch=torch.__version__, results=results), indent=1))
    failed = [k for k, v in results.items() if v["status"] == "FAIL"]
    print(f"{len(results)} rows, {len(failed)} failed: {', '.join(failed) or '-'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

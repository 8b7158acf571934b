"""Many model families, compiled with tritonfuse and checked against eager: what a new user
tries first. Each family is built from a small config of its own (random weights, two
layers), run for inference and for a training step (loss and every gradient), in float32,
compiled and eagerly on the same inputs.

    python scripts/wide_models_check.py                          # every family, cuda if present
    python scripts/wide_models_check.py qwen2,opt,bart --modes train --time-limit 500
    WIDE_CHECK_DEVICE=cpu python scripts/wide_models_check.py --list

Per (family, mode): the relative L2 error of the output and of the worst parameter
gradient against the same model in float64 (eager float32 where the model's own code fails
in float64), next to eager float32's own; graphs run eagerly, Dynamo graphs and breaks,
kernels made, the aten ops left as fallbacks, first-call seconds, or the exception. A row
fails when an error exceeds both ``--tolerance`` (1e-4) and 3x eager's own, when a graph ran
eagerly, or when anything raised.
Results go to ``$OUT/wide_check.json`` (or ``--out``) after every row, and a table to stdout.
Families whose config class this transformers lacks are skipped and listed.
"""
import argparse
import copy
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
AUDIO = dict(vocab_size=32, pad_token_id=0, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0,
             activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
             ctc_loss_reduction="mean")

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
    # a second set (stop 34): attention variants, MoE, state-space and recurrent models,
    # FFT, relative positions, pooling, depthwise and grouped convs, CTC speech models
    "gpt_bigcode": ("GPTBigCodeConfig", "AutoModelForCausalLM", dict(vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                                                                    n_positions=256, multi_query=True, resid_pdrop=0.0,
                                                                    embd_pdrop=0.0, attn_pdrop=0.0), "causal"),
    "codegen": ("CodeGenConfig", "AutoModelForCausalLM", dict(vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                                                             rotary_dim=16, n_positions=256, n_ctx=256, resid_pdrop=0.0,
                                                             embd_pdrop=0.0, attn_pdrop=0.0), "causal"),
    "mpt": ("MptConfig", "AutoModelForCausalLM", dict(vocab_size=1000, d_model=128, n_heads=4, n_layers=2,
                                                     max_seq_len=256), "causal"),
    "xglm": ("XGLMConfig", "AutoModelForCausalLM", dict(vocab_size=1000, d_model=128, num_layers=2, attention_heads=4,
                                                       ffn_dim=256, dropout=0.0, attention_dropout=0.0,
                                                       activation_dropout=0.0, max_position_embeddings=256), "causal"),
    "cohere": ("CohereConfig", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "granite": ("GraniteConfig", "AutoModelForCausalLM", dict(DECODER_KV, embedding_multiplier=2.0,
                                                             residual_multiplier=0.5, logits_scaling=4.0), "causal"),
    "nemotron": ("NemotronConfig", "AutoModelForCausalLM", DECODER_KV, "causal"),
    "qwen2_moe": ("Qwen2MoeConfig", "AutoModelForCausalLM", dict(DECODER_KV, num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=64,
                                                                shared_expert_intermediate_size=128), "causal"),
    "biogpt": ("BioGptConfig", "AutoModelForCausalLM", dict(TEXT, **NO_DROPOUT), "causal"),
    "mamba": ("MambaConfig", "AutoModelForCausalLM", dict(vocab_size=1000, hidden_size=64, state_size=8,
                                                         num_hidden_layers=2, expand=2, conv_kernel=4), "causal"),
    "rwkv": ("RwkvConfig", "AutoModelForCausalLM", dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                                       attention_hidden_size=64, intermediate_size=128,
                                                       context_length=256), "causal"),
    "xlnet": ("XLNetConfig", "AutoModelForCausalLM", dict(vocab_size=1000, d_model=128, n_layer=2, n_head=4,
                                                         d_inner=256, dropout=0.0), "causal"),
    "mpnet": ("MPNetConfig", "AutoModelForMaskedLM", dict(TEXT, **NO_DROPOUT, max_position_embeddings=258), "masked"),
    "funnel": ("FunnelConfig", "AutoModelForMaskedLM", dict(vocab_size=1000, block_sizes=[1, 1], d_model=128, n_head=4,
                                                           d_head=32, d_inner=256, hidden_dropout=0.0,
                                                           attention_dropout=0.0, activation_dropout=0.0), "masked"),
    "convbert": ("ConvBertConfig", "AutoModelForMaskedLM", dict(TEXT, embedding_size=128, **NO_DROPOUT), "masked"),
    "fnet": ("FNetConfig", "AutoModelForMaskedLM", dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                       intermediate_size=256, hidden_dropout_prob=0.0,
                                                       max_position_embeddings=256), "masked"),
    "mbart": ("MBartConfig", "AutoModelForSeq2SeqLM", ENC_DEC, "seq2seq"),
    "pegasus": ("PegasusConfig", "AutoModelForSeq2SeqLM", ENC_DEC, "seq2seq"),
    "longt5": ("LongT5Config", "AutoModelForSeq2SeqLM", dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=256,
                                                            num_layers=2, num_heads=4, dropout_rate=0.0,
                                                            decoder_start_token_id=0, local_radius=8), "seq2seq"),
    "switch": ("SwitchTransformersConfig", "AutoModelForSeq2SeqLM", dict(vocab_size=1000, d_model=128, d_kv=32,
                                                                        d_ff=256, num_layers=2, num_heads=4,
                                                                        num_sparse_encoder_layers=1,
                                                                        num_sparse_decoder_layers=1, num_experts=4,
                                                                        dropout_rate=0.0, router_jitter_noise=0.0,
                                                                        decoder_start_token_id=0), "seq2seq"),
    "wav2vec2": ("Wav2Vec2Config", "AutoModelForCTC", dict(AUDIO, conv_bias=True), "audio"),
    "hubert": ("HubertConfig", "AutoModelForCTC", dict(AUDIO, feat_extract_norm="layer", conv_bias=True), "audio"),
    "resnet_hf": ("ResNetConfig", "AutoModelForImageClassification", dict(VISION, embedding_size=16,
                                                                         hidden_sizes=[16, 32], depths=[1, 1]),
                  "image"),
    "regnet": ("RegNetConfig", "AutoModelForImageClassification", dict(VISION, embedding_size=16,
                                                                      hidden_sizes=[16, 32], depths=[1, 1],
                                                                      groups_width=8), "image"),
    "mobilenet_v2": ("MobileNetV2Config", "AutoModelForImageClassification", dict(VISION, depth_multiplier=0.25,
                                                                                 classifier_dropout_prob=0.0),
                     "image"),
    "mobilevit": ("MobileViTConfig", "AutoModelForImageClassification", dict(VISION, hidden_sizes=[32, 48, 64],
                                                                            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                                                            num_attention_heads=2, hidden_dropout_prob=0.0,
                                                                            attention_probs_dropout_prob=0.0,
                                                                            classifier_dropout_prob=0.0), "image"),
    "efficientnet": ("EfficientNetConfig", "AutoModelForImageClassification", dict(VISION, width_coefficient=0.25,
                                                                                  depth_coefficient=0.25,
                                                                                  dropout_rate=0.0,
                                                                                  drop_connect_rate=0.0, hidden_dim=320),
                     "image"),
    "poolformer": ("PoolFormerConfig", "AutoModelForImageClassification", dict(VISION, hidden_sizes=[16, 32],
                                                                              depths=[1, 1], num_encoder_blocks=2,
                                                                              patch_sizes=[3, 3], strides=[2, 2],
                                                                              padding=[1, 1], drop_path_rate=0.0,
                                                                              hidden_dropout_prob=0.0), "image"),
    "convnextv2": ("ConvNextV2Config", "AutoModelForImageClassification", dict(VISION, hidden_sizes=[16, 32],
                                                                              depths=[1, 1], num_stages=2), "image"),
    "bit": ("BitConfig", "AutoModelForImageClassification", dict(VISION, embedding_size=16, hidden_sizes=[16, 32],
                                                                depths=[1, 1], num_groups=8, drop_path_rate=0.0),
            "image"),
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
    if inputs == "causal":
        return dict(input_ids=ids, labels=ids)
    if inputs == "masked":   # labels unlike the inputs: a model that copies its input (Funnel's
        # residual from the embeddings) would otherwise reach a loss of 0 and gradients of noise
        return dict(input_ids=ids, labels=torch.randint(3, 1000, (batch, length), generator=g).to(device))
    if inputs == "seq2seq":
        return dict(input_ids=ids, labels=ids[:, : length // 2].contiguous())
    if inputs == "speech":
        features = torch.randn(batch, 16, 64, generator=g).to(device)
        return dict(input_features=features, labels=ids[:, :16].contiguous())
    if inputs == "audio":   # raw samples; CTC labels shorter than the frames the convs leave
        samples = torch.randn(batch, 2000, generator=g).to(device)
        return dict(input_values=samples, labels=torch.randint(1, 32, (batch, 12), generator=g).to(device))
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


# A compiled error may be this many times eager float32's own (both against float64).
ERROR_MARGIN = 3.0


def float64_reference(model, batch: dict, train: bool):
    """The model's output (and gradients) in float64: the reference both float32 runs are
    measured against, so that a gradient eager float32 itself gets only to 1e-3 (one behind
    two batch norms, zero in exact arithmetic) fails neither."""
    model64 = copy.deepcopy(model).double()
    batch64 = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    return run(model64, batch64, train)


def reference_and_eager(model, batch: dict, train: bool):
    """(the reference's output and gradients, eager float32's, what the reference is): the
    model in float64, or eager float32 itself where the model's own code fails in float64
    (an op without a double kernel, as MoE's grouped_mm on the CPU; a float32 constant of
    float64's range, as XGLM's mask)."""
    try:
        reference, label = float64_reference(model, batch, train), "float64"
    except Exception as error:  # the model's code, not the compiler: eager float32 stands in
        reference, label = None, f"eager float32 (float64 raised {type(error).__name__}: {str(error)[:120]})"
    eager = run(model, batch, train)
    return (eager if reference is None else reference), eager, label


def check(family: str, train: bool, device, tolerance: float) -> dict:
    import tritonfuse
    model, inputs = build(family, device)
    if model is None:
        return dict(status="skipped", reason="this transformers has no " + FAMILIES[family][0])
    model.train(train)
    batch = make_batch(inputs, device)
    (ref, ref_grads), (eager, eager_grads), reference = reference_and_eager(model, batch, train)
    tritonfuse.metrics.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="tritonfuse")
    start = time.perf_counter()
    got, grads = run(compiled, batch, train)
    first_s = time.perf_counter() - start
    got2, grads2 = run(compiled, batch, train)   # a second call: cached graphs, donated buffers
    # each error against float64, next to eager float32's own; a row fails where the
    # compiled one exceeds both the tolerance and ERROR_MARGIN times eager's
    def allowed(eager_error):
        return max(tolerance, ERROR_MARGIN * eager_error)

    errors = dict(output=max(rel_l2(ref, got), rel_l2(ref, got2)), eager_output=rel_l2(ref, eager))
    bad = [] if errors["output"] <= allowed(errors["eager_output"]) else ["output"]
    if train:
        if sorted(set(ref_grads) ^ set(grads)):
            errors["missing_grads"] = float("inf")
        floor = gradient_scale(ref_grads)
        per_grad = []
        for n in ref_grads:
            if n in grads:
                mine = max(grad_error(ref_grads[n], grads[n], floor), grad_error(ref_grads[n], grads2[n], floor))
                theirs = grad_error(ref_grads[n], eager_grads[n], floor)
                per_grad.append((mine / allowed(theirs), mine, theirs, n))
        _, errors["worst_grad"], errors["eager_worst_grad"], errors["worst_grad_name"] = max(per_grad)
        if errors["worst_grad"] > allowed(errors["eager_worst_grad"]):
            bad.append("worst_grad")
    metrics = tritonfuse.metrics
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    row = dict(status="ok", first_s=round(first_s, 1), eager_graphs=metrics.eager_graphs,
               eager_reasons=dict(metrics.eager_graph_reasons), graph_breaks=breaks,
               kernels=metrics.generated_kernel_count, graph_cache_hits=metrics.graph_cache_hits,
               aot_cache_hits=metrics.aot_cache_hits, fallbacks=sorted(metrics.fallbacks), reference=reference,
               **errors)
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

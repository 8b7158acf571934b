"""HF models (transformers, built from small configs) compiled with tritonfuse against eager (on cuda
when present, else the CPU; HF_CHECK_DEVICE=cpu|cuda picks):
inference and a training step (loss and gradients), graphs run eagerly, first-call seconds, and
optionally a sweep over 8 sequence lengths (compiles, time).

    python scripts/hf_models_check.py llama,bert,t5,gpt2 llama     # models, then models to sweep
"""
import sys, time, json, os, torch, transformers as T
import tritonfuse
dev = os.environ.get("HF_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
def build(name):
    common = dict(vocab_size=1000)
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=128, intermediate_size=256, max_position_embeddings=256, **common))
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=256, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, **common))
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=128, intermediate_size=256, hidden_dropout_prob=0, attention_probs_dropout_prob=0, **common))
    if name == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(num_layers=2, num_heads=4, d_model=128, d_kv=32, d_ff=256, dropout_rate=0, **common))
def run(model, name, ids, train):
    kw = dict(input_ids=ids, labels=ids)
    if name == "t5": kw["decoder_input_ids"] = ids
    out = model(**kw)
    if train:
        out.loss.backward()
        g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).float()
        for p in model.parameters(): p.grad = None
        return out.loss.detach().float(), g
    return out.logits.detach().float(), None
res = {}
for name in sys.argv[1].split(","):
    for train in (False, True):
        torch.manual_seed(0)
        m = build(name).to(dev)
        m.train(train)
        ids = torch.randint(0, 1000, (2, 64), device=dev)
        tritonfuse.metrics.reset()
        ctx = torch.enable_grad() if train else torch.no_grad()
        with ctx:
            ref, gref = run(m, name, ids, train)
            c = torch.compile(m, backend="tritonfuse")
            t0 = time.time(); got, g = run(c, name, ids, train); t1 = time.time() - t0
        err = (ref - got).abs().max().item()
        gerr = (gref - g).abs().max().item() / (gref.abs().max().item() + 1e-9) if train else 0
        r = dict(err=err, grad_rel_err=gerr, first_s=round(t1, 1), eager_graphs=tritonfuse.metrics.eager_graphs,
                 kernels=tritonfuse.metrics.generated_kernel_count)
        res[f"{name}-{'train' if train else 'infer'}"] = r
        print(name, "train" if train else "infer", r, flush=True)
        torch._dynamo.reset()
# dynamic: llama inference over 8 lengths
if len(sys.argv) > 2:
    for name in sys.argv[2].split(","):
        torch.manual_seed(0)
        m = build(name).to(dev).eval(); c = torch.compile(m, backend="tritonfuse")
        tritonfuse.metrics.reset(); t0 = time.time(); worst = 0
        with torch.no_grad():
            for L in (17, 23, 32, 45, 64, 77, 100, 128):
                ids = torch.randint(0, 1000, (2, L), device=dev)
                ref, _ = run(m, name, ids, False); got, _ = run(c, name, ids, False)
                worst = max(worst, (ref - got).abs().max().item())
        mt = tritonfuse.metrics
        r = dict(total_s=round(time.time() - t0, 1), worst_err=worst, eager=mt.eager_graphs,
                 symbolic=getattr(mt, "symbolic_graphs", None), static=getattr(mt, "static_specializations", None))
        res[f"{name}-dynamic8"] = r; print(name, "dynamic", r, flush=True)
        torch._dynamo.reset()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "hf_check.json"), "w"), indent=1)

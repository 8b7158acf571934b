"""Real models for the model suites of scripts/bench.py (`--suite models`, `--suite dynamic`).

Every model is built from a config with random weights (no download), seeded so that every
process builds the same weights, in float32 on the CPU; the suites move it to the device
and dtype they time. Two groups:

  main      GPT-2, BERT, Llama, T5 (HF transformers: hidden 768, 12 heads, FFN 3072,
            2 layers, vocab 32000, dropout 0), a ResNet-18 (convs + batch norm) and a ViT
  held-out  models and shapes nobody tunes against: DistilBERT, a Pythia-style GPT-NeoX
            and a Mistral-style Llama at hidden 1024 / 16 heads, and a ConvNeXt
  extra     nn-lm, a small language model in plain torch.nn (the text sizes below); it
            needs no transformers, so the suites' tests run it

On the CPU every model is much smaller (hidden 64-96, vocab 1000, 32x32 images) so that a
2-core machine compiles them all in minutes. HF models need `transformers`; the vision
models use timm's when timm is installed (GPU sizes only) and a torch.nn version
otherwise. Nothing here is imported by the product or needed by its tests.

A step is what the suites compile: ``Step(model, mode)`` called with a batch (a dict of
tensors) returns the loss (mode "train": forward + loss; the caller runs backward) or the
logits (mode "infer").
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# Text sizes per device type: (hidden, heads, FFN, layers, vocab).
TEXT = {"cuda": dict(hidden=768, heads=12, ffn=3072, layers=2, vocab=32000),
        "cpu": dict(hidden=64, heads=4, ffn=256, layers=2, vocab=1000)}
# The held-out text models use another width: (hidden, heads, FFN).
WIDE = {"cuda": dict(hidden=1024, heads=16, ffn=4096),
        "cpu": dict(hidden=96, heads=6, ffn=384)}


@dataclass(frozen=True)
class Shapes:
    """Batch and length (tokens, or image side) of the training and the inference step."""

    train_batch: int
    train_len: int
    infer_batch: int
    infer_len: int


SHAPES = {
    "text": {"cuda": Shapes(8, 512, 1, 128), "cpu": Shapes(2, 64, 1, 32)},
    "vision": {"cuda": Shapes(32, 224, 1, 224), "cpu": Shapes(4, 32, 1, 32)},
}
NUM_CLASSES = {"cuda": 1000, "cpu": 10}


def size_key(device: torch.device | str) -> str:
    return "cpu" if torch.device(device).type == "cpu" else "cuda"


def has_timm() -> bool:
    try:
        import timm  # noqa: F401
    except Exception:
        return False
    return True


def transformers_missing() -> str | None:
    """Why HF models cannot be built here (None when they can)."""
    try:
        import transformers  # noqa: F401
    except Exception as exc:
        return f"transformers is not installed ({type(exc).__name__}: {exc})"
    return None


# ----------------------------------------------------------------------------------------
# HF transformers models
# ----------------------------------------------------------------------------------------


def _text(size: str, wide: bool = False) -> dict:
    t = dict(TEXT[size])
    if wide:
        t.update(WIDE[size])
    return t


def build_gpt2(size: str) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    t = _text(size)
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=t["vocab"], n_positions=1024, n_embd=t["hidden"], n_layer=t["layers"],
        n_head=t["heads"], n_inner=t["ffn"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0, use_cache=False))


def build_bert(size: str) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM
    t = _text(size)
    return BertForMaskedLM(BertConfig(
        vocab_size=t["vocab"], hidden_size=t["hidden"], num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"], intermediate_size=t["ffn"], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, max_position_embeddings=512))


def llama_config(size: str, kv_heads: int | None = None, wide: bool = False, **extra):
    from transformers import LlamaConfig
    t = _text(size, wide)
    return LlamaConfig(
        vocab_size=t["vocab"], hidden_size=t["hidden"], intermediate_size=t["ffn"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        num_key_value_heads=kv_heads or t["heads"], max_position_embeddings=2048,
        use_cache=False, **extra)


def build_llama(size: str, kv_heads: int | None = None) -> nn.Module:
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM(llama_config(size, kv_heads))


def build_t5(size: str) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    t = _text(size)
    return T5ForConditionalGeneration(T5Config(
        vocab_size=t["vocab"], d_model=t["hidden"], d_kv=t["hidden"] // t["heads"], d_ff=t["ffn"],
        num_layers=t["layers"], num_decoder_layers=t["layers"], num_heads=t["heads"],
        dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0))


def build_vit(size: str) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification
    t = _text(size)
    return ViTForImageClassification(ViTConfig(
        hidden_size=t["hidden"], num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        intermediate_size=t["ffn"], image_size=SHAPES["vision"][size].train_len,
        patch_size=16 if size == "cuda" else 8, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=NUM_CLASSES[size],
        problem_type="single_label_classification"))


def build_distilbert(size: str) -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    t = _text(size)
    return DistilBertForMaskedLM(DistilBertConfig(
        vocab_size=t["vocab"], dim=t["hidden"], n_layers=t["layers"], n_heads=t["heads"],
        hidden_dim=t["ffn"], dropout=0.0, attention_dropout=0.0, max_position_embeddings=512))


def build_pythia(size: str) -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    t = _text(size, wide=True)
    return GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=t["vocab"], hidden_size=t["hidden"], num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"], intermediate_size=t["ffn"], rotary_pct=0.25,
        use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0,
        max_position_embeddings=2048, use_cache=False))


def build_mistral(size: str) -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM
    t = _text(size, wide=True)
    return MistralForCausalLM(MistralConfig(
        vocab_size=t["vocab"], hidden_size=t["hidden"], intermediate_size=t["ffn"] * 7 // 8,
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        num_key_value_heads=t["heads"] // 2, sliding_window=None, max_position_embeddings=2048,
        use_cache=False))


# ----------------------------------------------------------------------------------------
# Vision models in torch.nn (used on the CPU, and on GPUs when timm is absent)
# ----------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + batch norm, a projected shortcut on a change."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with basic blocks: widths (64, 128, 256, 512) and depths (2, 2, 2, 2) make
    ResNet-18."""

    def __init__(self, widths=(64, 128, 256, 512), depths=(2, 2, 2, 2), num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for stage, (width, depth) in enumerate(zip(widths, depths)):
            for i in range(depth):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and i == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 conv, LayerNorm, 4x MLP with GELU, layer scale, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(40, 80, 160, 320), depths=(2, 2, 6, 2), num_classes=1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])]
        for stage, (dim, depth) in enumerate(zip(dims, depths)):
            if stage:
                layers += [LayerNorm2d(dims[stage - 1]), nn.Conv2d(dims[stage - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


def build_resnet(size: str) -> nn.Module:
    if size == "cpu":
        return ResNet(widths=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_classes=NUM_CLASSES[size])
    if has_timm():
        import timm
        return timm.create_model("resnet18", num_classes=NUM_CLASSES[size])
    return ResNet(num_classes=NUM_CLASSES[size])


def build_convnext(size: str) -> nn.Module:
    if size == "cpu":
        return ConvNeXt(dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_classes=NUM_CLASSES[size])
    if has_timm():
        import timm
        return timm.create_model("convnext_atto", num_classes=NUM_CLASSES[size])
    return ConvNeXt(num_classes=NUM_CLASSES[size])


class TorchLM(nn.Module):
    """A language model in plain torch.nn: token and position embeddings, pre-LayerNorm
    transformer blocks (scripts/models.py), a final LayerNorm and the LM head."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, max_len: int = 2048):
        super().__init__()
        from scripts.models import TransformerBlock

        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(TransformerBlock(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_torch_lm(size: str) -> nn.Module:
    t = _text(size)
    return TorchLM(t["vocab"], t["hidden"], t["heads"], t["layers"])


# ----------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """One model of the suites.

    inputs   "tokens" (input_ids, labels), "seq2seq" (input_ids, labels or
             decoder_input_ids) or "image" (pixel_values, labels)
    hf       True: an HF model that takes the batch as keywords and returns .loss/.logits;
             False: a plain module called with the image or the token ids, returning
             logits; loss = cross entropy outside
    """

    name: str
    group: str
    build: Callable[[str], nn.Module]
    inputs: str
    hf: bool = True

    def shapes(self, device) -> Shapes:
        return SHAPES["vision" if self.inputs == "image" else "text"][size_key(device)]


MODELS: list[ModelSpec] = [
    ModelSpec("gpt2", "main", build_gpt2, "tokens"),
    ModelSpec("bert", "main", build_bert, "tokens"),
    ModelSpec("llama", "main", build_llama, "tokens"),
    ModelSpec("t5", "main", build_t5, "seq2seq"),
    ModelSpec("resnet", "main", build_resnet, "image", hf=False),
    ModelSpec("vit", "main", build_vit, "image"),
    ModelSpec("distilbert", "held-out", build_distilbert, "tokens"),
    ModelSpec("pythia", "held-out", build_pythia, "tokens"),
    ModelSpec("mistral", "held-out", build_mistral, "tokens"),
    ModelSpec("convnext", "held-out", build_convnext, "image", hf=False),
    ModelSpec("nn-lm", "extra", build_torch_lm, "tokens", hf=False),
]
MODELS_BY_NAME = {m.name: m for m in MODELS}


def build_llama_gqa(size: str) -> nn.Module:
    """The dynamic-shape suite's model: Llama with half as many KV heads as heads."""
    return build_llama(size, kv_heads=TEXT[size]["heads"] // 2)


# The model of `--suite dynamic` (issue 17's measurement); in no group of the model suite.
DYNAMIC_MODEL = ModelSpec("llama-gqa", "dynamic", build_llama_gqa, "tokens")


def text_model(name: str) -> ModelSpec:
    """The dynamic suite's model by name: DYNAMIC_MODEL's or a text model of the table."""
    if name == DYNAMIC_MODEL.name:
        return DYNAMIC_MODEL
    spec = MODELS_BY_NAME.get(name)
    if spec is None or spec.inputs == "image":
        text = [DYNAMIC_MODEL.name] + [m.name for m in MODELS if m.inputs != "image"]
        raise ValueError(f"unknown text model {name!r}; known: {text}")
    return spec
GROUPS = ("main", "held-out", "extra")
QUICK = ("gpt2", "llama", "resnet")


def select_models(selection: str, quick: bool = False) -> list[ModelSpec]:
    """"main", "held-out", "extra", "all", or comma-separated model names. With ``quick`` a
    group keeps only its models in QUICK (and one model at least)."""
    if selection == "all":
        chosen = list(MODELS)
    elif selection in GROUPS:
        chosen = [m for m in MODELS if m.group == selection]
    else:
        names = [n.strip() for n in selection.split(",") if n.strip()]
        unknown = [n for n in names if n not in MODELS_BY_NAME]
        if unknown:
            raise ValueError(f"unknown model(s) {unknown}; known: {sorted(MODELS_BY_NAME)}")
        return [MODELS_BY_NAME[n] for n in names]
    if quick:
        chosen = [m for m in chosen if m.name in QUICK] or chosen[:1]
    return chosen


def describe_model(model: nn.Module) -> dict:
    """Where a model's class comes from ("HF", "timm", "torch.nn"), its name and size."""
    module = type(model).__module__
    impl = "HF" if module.startswith("transformers") else "timm" if module.startswith("timm") else "torch.nn"
    params = sum(p.numel() for p in model.parameters())
    return {"impl": impl, "class": type(model).__name__, "params_m": round(params / 1e6, 2)}


def build_model(spec: ModelSpec, device, seed: int = 0) -> nn.Module:
    """The model in float32 on the CPU, its weights a function of ``seed`` only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return spec.build(size_key(device))


def _randint(high: int, shape, device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=gen).to(device)


def make_batch(spec: ModelSpec, mode: str, device, dtype: torch.dtype,
               batch: int | None = None, length: int | None = None, seed: int = 1) -> dict:
    """The inputs of one step; ``batch`` and ``length`` default to the spec's shapes."""
    shapes = spec.shapes(device)
    batch = batch or (shapes.train_batch if mode == "train" else shapes.infer_batch)
    length = length or (shapes.train_len if mode == "train" else shapes.infer_len)
    size = size_key(device)
    if spec.inputs == "image":
        gen = torch.Generator().manual_seed(seed)
        pixels = torch.randn((batch, 3, length, length), generator=gen).to(device, dtype)
        out = {"pixel_values": pixels}
        if mode == "train":
            out["labels"] = _randint(NUM_CLASSES[size], (batch,), device, seed + 1)
        return out
    vocab = TEXT[size]["vocab"]
    out = {"input_ids": _randint(vocab, (batch, length), device, seed)}
    if mode == "train":
        out["labels"] = _randint(vocab, (batch, length), device, seed + 1)
    elif spec.inputs == "seq2seq":
        out["decoder_input_ids"] = _randint(vocab, (batch, length), device, seed + 2)
    return out


def cast_batch(batch: dict, dtype: torch.dtype) -> dict:
    """The batch with its floating-point tensors in ``dtype`` (token ids stay integers)."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


class Step(nn.Module):
    """What the suites compile: batch -> loss ("train") or logits ("infer")."""

    def __init__(self, spec: ModelSpec, model: nn.Module, mode: str):
        super().__init__()
        self.model = model
        self.hf = spec.hf
        self.input_key = "pixel_values" if spec.inputs == "image" else "input_ids"
        self.train_mode = mode == "train"

    def forward(self, batch: dict) -> torch.Tensor:
        if self.hf:
            out = self.model(**batch)
            return out.loss if self.train_mode else out.logits
        logits = self.model(batch[self.input_key])
        if not self.train_mode:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))


def make_step(spec: ModelSpec, mode: str, device, dtype: torch.dtype, seed: int = 0,
              reference_dtype: torch.dtype | None = None) -> tuple[Step, Step | None]:
    """(the step on ``device`` in ``dtype``, and a copy of it in ``reference_dtype`` with
    the same weights, or None). Training steps are in train mode, inference in eval mode."""
    model = build_model(spec, device, seed)
    model.train(mode == "train")
    reference = None
    if reference_dtype is not None:
        reference = Step(spec, copy.deepcopy(model).to(device, reference_dtype), mode)
    return Step(spec, model.to(device, dtype), mode), reference

"""The model zoo: models users fine-tune, from the libraries they come from (HF transformers, torchvision,
timm), built from tiny configs with random weights (nothing downloads), wrapped as a user would
(its inputs in, logits out: token ids with their attention mask, or pixels), each with a batch of data and
what gradbridge does with it.

For each format (``format="torchscript"``, ``format="export"``) a case expects either ``"bitwise"`` (exported,
and Java trains it like the user's eager model bit for bit) or the start of the one line the export refuses
it with. docs/export.md's model table says the same (tests/test_model_zoo.py pins them together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple, Union

import torch
from torch import Tensor, nn

VOCAB, LENGTH, CLASSES = 100, 12, 3
EOS, PAD = 2, 1


class TokenClassifier(nn.Module):
    """An HF sequence classifier fed token ids and their attention mask, returning its logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class TokenIdsClassifier(nn.Module):
    """An HF sequence classifier fed token ids alone (rows without padding), returning its logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids=input_ids).logits


class ImageClassifier(nn.Module):
    """An HF image classifier fed pixels, returning its logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits


def _tokens(n: int, seed: int) -> Tuple[Dict[str, Tensor], Tensor]:
    """Rows of different lengths, padded: one end-of-sequence token per row (BART and T5 classify at
    it), then padding that the attention mask hides."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, VOCAB, (n, LENGTH), generator=g)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (n,), generator=g)
    mask = (torch.arange(LENGTH) < lengths[:, None]).to(torch.int64)
    x[torch.arange(n), lengths - 1] = EOS
    x[mask == 0] = PAD
    return {"input_ids": x, "attention_mask": mask}, torch.randint(0, CLASSES, (n,), generator=g)


def _token_ids(n: int, seed: int) -> Tuple[Tensor, Tensor]:
    """Token ids alone, every row full length."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n, LENGTH), generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _images(n: int, seed: int, side: int = 16) -> Tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, side, side, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _tokens_and_images(n: int, seed: int) -> Tuple[Dict[str, Tensor], Tensor]:
    """A caption (padded token ids and their mask) and an image per row."""
    tokens, y = _tokens(n, seed)
    images, _ = _images(n, seed + 1)
    return {**tokens, "pixel_values": images}, y


_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=VOCAB,
              max_position_embeddings=64, num_labels=CLASSES)


def bert() -> nn.Module:
    import transformers as hf
    return TokenClassifier(hf.BertForSequenceClassification(hf.BertConfig(**_SMALL)))


def distilbert() -> nn.Module:
    import transformers as hf
    return TokenClassifier(hf.DistilBertForSequenceClassification(hf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=37, max_position_embeddings=64,
        num_labels=CLASSES)))


def roberta() -> nn.Module:
    import transformers as hf
    return TokenClassifier(hf.RobertaForSequenceClassification(hf.RobertaConfig(**_SMALL, pad_token_id=PAD)))


def _gpt2() -> nn.Module:
    import transformers as hf
    return hf.GPT2ForSequenceClassification(hf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, num_labels=CLASSES, pad_token_id=0))


def gpt2() -> nn.Module:
    return TokenClassifier(_gpt2())


def gpt2_ids() -> nn.Module:
    return TokenIdsClassifier(_gpt2())


def t5() -> nn.Module:
    import transformers as hf
    return TokenClassifier(hf.T5ForSequenceClassification(hf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=37, num_layers=2, num_heads=2, num_labels=CLASSES,
        eos_token_id=EOS, pad_token_id=0, decoder_start_token_id=0)))


class PooledEncoder(nn.Module):
    """An HF encoder (no task head of its own) under a mean over the unmasked tokens and a linear head."""

    def __init__(self, encoder: nn.Module, width: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(width, CLASSES)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1))


def t5_encoder() -> nn.Module:
    import transformers as hf
    return PooledEncoder(hf.T5EncoderModel(hf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=37, num_layers=2, num_heads=2, pad_token_id=0)), 32)


def bart() -> nn.Module:
    import transformers as hf
    return TokenClassifier(hf.BartForSequenceClassification(hf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
        num_labels=CLASSES, eos_token_id=EOS, pad_token_id=PAD)))


def vit() -> nn.Module:
    import transformers as hf
    return ImageClassifier(hf.ViTForImageClassification(hf.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, image_size=16,
        patch_size=4, num_labels=CLASSES)))


class ClipPairClassifier(nn.Module):
    """CLIP's two towers on a caption and an image, classified from both embeddings and their scaled similarity
    (the logit scale trains too), as a user fine-tunes CLIP for an image-text task."""

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip
        dim = clip.config.projection_dim
        self.head = nn.Linear(2 * dim + 1, CLASSES)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, pixel_values: Tensor) -> Tensor:
        out = self.clip(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values)
        text, image = out.text_embeds, out.image_embeds
        similarity = self.clip.logit_scale.exp() * (text * image).sum(-1, keepdim=True)
        return self.head(torch.cat([text, image, similarity], dim=-1))


def clip() -> nn.Module:
    import transformers as hf
    tower = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    return ClipPairClassifier(hf.CLIPModel(hf.CLIPConfig(
        text_config=dict(tower, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=EOS,
                         pad_token_id=PAD),
        vision_config=dict(tower, image_size=16, patch_size=4), projection_dim=16)))


def _decoder(model: str, config: str, **extra) -> nn.Module:
    """A decoder-only transformer (grouped-query attention, rotary frequencies in a constant buffer) under HF's
    sequence-classification head, which classifies each row at its last non-padding token."""
    import transformers as hf
    return TokenClassifier(getattr(hf, model)(getattr(hf, config)(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=PAD, num_labels=CLASSES, **extra)))


def llama() -> nn.Module:
    return _decoder("LlamaForSequenceClassification", "LlamaConfig")


def qwen2() -> nn.Module:
    return _decoder("Qwen2ForSequenceClassification", "Qwen2Config")


def mistral() -> nn.Module:
    return _decoder("MistralForSequenceClassification", "MistralConfig")


def phi3() -> nn.Module:
    return _decoder("Phi3ForSequenceClassification", "Phi3Config")


def gemma() -> nn.Module:
    return _decoder("GemmaForSequenceClassification", "GemmaConfig", head_dim=16)


def gemma2() -> nn.Module:
    """Gemma 2: logit soft-capping and sliding-window layers."""
    return _decoder("Gemma2ForSequenceClassification", "Gemma2Config", head_dim=16, sliding_window=8)


def modernbert() -> nn.Module:
    """ModernBERT: rotary attention, alternating local and global layers, GeGLU, no biases."""
    import transformers as hf
    return TokenClassifier(hf.ModernBertForSequenceClassification(hf.ModernBertConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, vocab_size=VOCAB,
        max_position_embeddings=64, pad_token_id=PAD, num_labels=CLASSES, local_attention=4)))


def lora_bert() -> nn.Module:
    """BERT with PEFT LoRA adapters on its attention (query, value): the base frozen by PEFT, the adapters and
    the classification head train."""
    import peft
    import transformers as hf
    base = hf.BertForSequenceClassification(hf.BertConfig(**_SMALL))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.1,
                             modules_to_save=["classifier"])
    return TokenClassifier(peft.get_peft_model(base, config))


def resnet18() -> nn.Module:
    import torchvision
    return torchvision.models.resnet18(num_classes=CLASSES)


def timm_mobilevitv2() -> nn.Module:
    import timm
    return timm.create_model("mobilevitv2_050", num_classes=CLASSES)


def timm_convnext() -> nn.Module:
    """timm's own tiny ConvNeXt (its test model: LayerNorm, depthwise convolutions, layer scale)."""
    import timm
    return timm.create_model("test_convnext", num_classes=CLASSES)


Expected = Union[str, Dict[str, str]]


@dataclass(frozen=True)
class Case:
    name: str
    library: str
    build: Callable[[], nn.Module]
    #: (inputs, targets): the inputs a tensor, or a dict of tensors by the name forward takes them by
    data: Callable[[int, int], Tuple[Any, Tensor]]
    #: format="torchscript": "bitwise", or the start of the export's one-line refusal; or one of those for
    #: each transformers major ({"4": ..., "5": ...}) where the majors differ
    torchscript: Expected
    #: format="export" (protocol 3): the same
    export: Expected
    #: runs with --full only (the default run keeps one case of each kind)
    full_only: bool = False

    def expected(self, format: str) -> str:
        said = getattr(self, format)
        return said if isinstance(said, str) else said[transformers_major()]


def transformers_major() -> str:
    import transformers
    return transformers.__version__.split(".")[0]


#: protocol 3 refuses a model whose Python code branches on (or sizes by) the values in its tensors
DATA_DEPENDENT = "torch.export cannot capture TokenClassifier's training step: the model's Python code depends on "

#: a decoder's TorchScript export under each transformers major
DECODER_TORCHSCRIPT = {"4": "cannot script or trace TokenClassifier", "5": "bitwise"}

CASES = (
    Case("BERT", "transformers", bert, _tokens, "bitwise", "bitwise"),
    Case("DistilBERT", "transformers", distilbert, _tokens, "bitwise", "bitwise", full_only=True),
    Case("RoBERTa", "transformers", roberta, _tokens, "bitwise", "bitwise", full_only=True),
    # transformers 4.x's causal mask (masking_utils) runs under torch.vmap, which torch.jit.trace cannot record
    Case("GPT-2", "transformers", gpt2, _tokens, {"4": "cannot script or trace TokenClassifier", "5": "bitwise"},
         "bitwise"),
    # 4.x's head picks each row's last token at torch.arange(batch_size), which a trace freezes at the example's
    Case("GPT-2 (token ids only)", "transformers", gpt2_ids, _token_ids,
         {"4": "export check failed: evaluate (eval mode) on 3 of the example's 4 rows raised", "5": "bitwise"},
         "bitwise"),
    # the classification head checks and picks each row's end-of-sequence token by its value
    Case("T5", "transformers", t5, _tokens, "bitwise", DATA_DEPENDENT),
    Case("T5 encoder (mean-pooled)", "transformers", t5_encoder, _tokens, "bitwise", "bitwise"),
    # LayerDrop: `if torch.rand([]) < self.layerdrop` in Python (4.x)
    Case("BART", "transformers", bart, _tokens,
         {"4": "export check failed: train_step 1: your eager model draws random numbers as", "5": "bitwise"},
         DATA_DEPENDENT),
    Case("ViT", "transformers", vit, _images, "bitwise", "bitwise"),
    Case("CLIP (two towers)", "transformers", clip, _tokens_and_images, "bitwise", "bitwise"),
    Case("ResNet-18 (BatchNorm)", "torchvision", resnet18, _images, "bitwise", "bitwise"),
    Case("ConvNeXt (timm's test model)", "timm", timm_convnext, lambda n, seed: _images(n, seed, 32), "bitwise",
         "bitwise"),
    Case("MobileViTv2", "timm", timm_mobilevitv2, lambda n, seed: _images(n, seed, 64), "bitwise", "bitwise",
         full_only=True),
    Case("ModernBERT", "transformers", modernbert, _tokens, "bitwise", "bitwise"),
    # transformers 4.x builds a decoder's causal mask under torch.vmap (as GPT-2's above); 5.x does not
    Case("Qwen2", "transformers", qwen2, _tokens, DECODER_TORCHSCRIPT, "bitwise"),
    Case("Llama", "transformers", llama, _tokens, DECODER_TORCHSCRIPT, "bitwise", full_only=True),
    Case("Mistral", "transformers", mistral, _tokens, DECODER_TORCHSCRIPT, "bitwise", full_only=True),
    Case("Phi-3", "transformers", phi3, _tokens, DECODER_TORCHSCRIPT, "bitwise", full_only=True),
    Case("Gemma", "transformers", gemma, _tokens, DECODER_TORCHSCRIPT, "bitwise", full_only=True),
    Case("Gemma 2", "transformers", gemma2, _tokens, DECODER_TORCHSCRIPT, "bitwise", full_only=True),
    Case("BERT with LoRA (peft)", "transformers", lora_bert, _tokens, "bitwise", "bitwise", full_only=True),
)

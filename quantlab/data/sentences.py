"""``sentences``: English sentence pairs for sentence-embedding models (MiniLM), tokenized.

Each pair is a paraphrase (label 1) or two unrelated sentences (label 0). Fixed split:
calibration pool = CALIB_PAIRS (8 pairs), evaluation pool = EVAL_PAIRS (16 pairs, paraphrase and
unrelated alternating). A batch holds ``batch_size`` pairs as 2 * batch_size sentences
(a1, b1, a2, b2, ...) tokenized together: (input_ids, attention_mask), each (2 * batch_size, T)
int64 padded to the batch's longest sentence. ``labels``: one (batch_size,) int64 tensor per
evaluation batch.
"""

from __future__ import annotations

import torch

from quantlab.data.dataset import Dataset, batches, take
from quantlab.data.schema import DataConfig
from quantlab.models.inputs import ModelInputs

CALIB_PAIRS: tuple[tuple[str, str, int], ...] = (
    ("The train leaves the station at noon.", "At twelve o'clock the train departs.", 1),
    ("She planted tomatoes in the garden.", "The committee approved the budget.", 0),
    ("The children are playing football in the park.", "Kids play soccer in the park.", 1),
    ("He repaired the bicycle chain.", "The ocean was calm this morning.", 0),
    ("The museum opens at nine.", "Doors of the museum open at 9 a.m.", 1),
    ("A storm knocked out the power.", "She is learning to play the violin.", 0),
    ("The recipe needs two eggs.", "You will need a pair of eggs for this recipe.", 1),
    ("Prices rose sharply last year.", "The dog chased a ball across the yard.", 0),
)

EVAL_PAIRS: tuple[tuple[str, str, int], ...] = (
    ("A man is playing a guitar.", "Someone is playing the guitar.", 1),
    ("A man is playing a guitar.", "The stock market fell sharply today.", 0),
    ("The cat is sleeping on the sofa.", "A cat naps on the couch.", 1),
    ("The cat is sleeping on the sofa.", "Engineers tested the new bridge design.", 0),
    ("How do I reset my password?", "What are the steps to change my password?", 1),
    ("How do I reset my password?", "Tomatoes grow best in warm weather.", 0),
    ("The meeting was moved to Friday.", "They rescheduled the meeting for Friday.", 1),
    ("The meeting was moved to Friday.", "A young girl is riding a horse.", 0),
    ("Heavy rain caused flooding in the city.", "The city flooded after a downpour.", 1),
    ("Heavy rain caused flooding in the city.", "He prefers tea over coffee.", 0),
    ("The company hired fifty new employees.", "Fifty people joined the firm.", 1),
    ("The company hired fifty new employees.", "The telescope observed a distant galaxy.", 0),
    ("She finished the marathon in four hours.", "She ran the marathon in 4 hours.", 1),
    ("She finished the marathon in four hours.", "The bakery sells fresh bread daily.", 0),
    ("The laptop battery lasts all day.", "This notebook's battery holds a full day.", 1),
    ("The laptop battery lasts all day.", "Birds migrate south in the autumn.", 0),
)


def _collate(pairs: list[tuple[str, str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    from quantlab.models.minilm import tokenize

    return tokenize([s for a, b, _ in pairs for s in (a, b)])


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    if model is not None and model.name != "minilm":
        raise ValueError(
            f"data 'sentences' holds tokenized text for model 'minilm'; got model '{model.name}'"
        )
    calib = take(CALIB_PAIRS, cfg.num_calib)
    evals = take(EVAL_PAIRS, cfg.num_eval)
    bs = cfg.batch_size
    return Dataset(
        name="sentences",
        calib=batches(calib, bs, _collate),
        eval=batches(evals, bs, _collate),
        labels=batches(evals, bs, lambda ps: torch.tensor([p[2] for p in ps], dtype=torch.int64)),
        description=f"{len(calib)} calibration + {len(evals)} evaluation sentence pairs "
        f"(paraphrase / unrelated), WordPiece tokens",
        calib_ids=[f"{a} || {b}" for a, b, _ in calib],
        eval_ids=[f"{a} || {b}" for a, b, _ in evals],
    )

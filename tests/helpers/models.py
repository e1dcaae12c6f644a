"""The tiny models under test: noisy weights, the RL prompts of the sample data, tolerances per family,
and a counter of the models a run loads."""

from __future__ import annotations

import torch

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from tests.helpers.paths import SAMPLE, TINY_MODELS

K = 3

#: Per-step generation logits (noise 0.5 models: logits of order 1-10) per family.
LOGIT_TOLS = {"qwen3_vl": dict(rtol=1e-4, atol=1e-4), "qwen3_5": dict(rtol=1e-3, atol=5e-4)}

#: Log-prob tolerance and gradient tolerance (relative to each tensor's largest entry) per family.
LOGP_TOLS = {"qwen3_vl": dict(rtol=1e-5, atol=2e-5), "qwen3_5": dict(rtol=1e-5, atol=2e-5)}

GRAD_TOLS = {"qwen3_vl": 1e-5, "qwen3_5": 5e-5}


def sample_rl_datamodule(path):
    """The sample data's RL DataModule (8 frames, 4096 pixels, batches of 2) for the model at ``path``, set up."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=str(path)),
                         loader=LoaderConfig(data_mode="rl", batch_size=2, num_workers=0))
    dm.setup("fit")
    return dm


def load_model(family: str, train: bool = False, noise: float = 0.5):
    """The family's tiny model with seeded Gaussian noise on every weight (diverse greedy tokens)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(TINY_MODELS[family]), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    return model.train(train)


def generate_with_logits(model, tokenizer, inputs, **kwargs):
    """``model.generate`` of 10 new tokens returning the per-step logits (``output_logits``)."""
    return model.generate(**inputs, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id, output_logits=True,
                          return_dict_in_generate=True, **kwargs)


def assert_grad_close(actual, expected, name: str, family: str) -> None:
    """Float32 tolerance relative to the tensor's largest entry (sums run in a different order)."""
    scale = GRAD_TOLS[family]
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=scale * expected.abs().max().item() + 1e-9,
                               msg=lambda m: f"{name}: {m}")


def random_completions(tok, n: int, lc: int = 9):
    """``n`` seeded random completions of up to ``lc`` tokens: ids ``(n, lc)`` padded with ``tok``'s pad id, and
    the bool mask ``(n, lc)`` of their lengths ``[lc, 4, 1, lc, 7, 2][:n]``."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 500, (n, lc), generator=gen)
    lengths = torch.tensor([lc, 4, 1, lc, 7, 2][:n])
    mask = torch.arange(lc)[None] < lengths[:, None]
    return ids.masked_fill(~mask, tok.pad_token_id), mask



def load_tiny_policy(path):
    """The tiny Qwen3-VL at ``path`` as a float32 policy in eval mode."""
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


def perturb_weights(model, seed, scale=0.05):
    """Add seeded Gaussian noise (std ``scale``) to every language-model weight in place (the vision tower unchanged)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" not in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


class ModelLoads:
    """Counts the models a run loads (:func:`grasp_lightning.policy.load_model`: the policy and the reference
    both go through it), as a context manager over ``monkeypatch``; ``paths`` lists each load's
    ``name_or_path``."""

    def __init__(self, monkeypatch) -> None:
        import grasp_lightning.policy as policy

        self.paths: list[str] = []
        real = policy.load_model

        def counting(name_or_path, **kwargs):
            self.paths.append(str(name_or_path))
            return real(name_or_path, **kwargs)

        monkeypatch.setattr(policy, "load_model", counting)

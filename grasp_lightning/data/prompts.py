"""Chat messages and token ids of one GRASP example, through the processor's own chat template.

The prompt (system + user turn with the video, question, options and instruction, then the
generation prompt) is rendered with ``processor.apply_chat_template`` and encoded by the processor
together with the decoded frames and their real timestamps. The assistant target is tokenised
separately and appended, exactly as GRPO appends sampled completion ids to the prompt ids, so SFT
and GRPO see identical prompt tokens. Labels cover only the target tokens. A Thinking template's
generation prompt ends with an opened ``<think>``; the target then continues inside that block and
does not repeat the tag (:func:`render_texts`).

Source: GRASP prompt format (``docs/data-format.md``, "Prompt and response"); transformers'
Qwen3-VL processor (``video_metadata`` with ``do_sample_frames=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grasp_lightning.data.records import GraspItem
from grasp_lightning.errors import GraspConfigError, TokenBudgetError
from grasp_lightning.parsing import opens_think

#: System prompt of the GRASP MCQ format (paraphrased from the dataset card).
DEFAULT_SYSTEM_PROMPT = (
    "You are watching a video of several people, named Person 0, Person 1, and so on. "
    "Answer the multiple-choice question with only the option letter inside <answer> tags."
)
#: Instruction appended to a question that does not already carry it.
INSTRUCTION = (
    "Think step by step about the gaze and gesture interactions, describe them in <gaze> and "
    "<gesture> tags, and give the letter in <answer> tags."
)
IGNORE_INDEX = -100
#: The Qwen chat format's vision special tokens (placeholders the processor expands): never sampled
#: (``grasp_lightning/engines/decoding.py``), a reward of 0 when they appear (``grasp_lightning/grpo/rewards.py``).
VISION_TOKENS: tuple[str, ...] = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                  "<|video_pad|>")
#: The Qwen chat format's turn tokens; with :data:`VISION_TOKENS` the special tokens of a Qwen vocabulary.
CHAT_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def vision_token_config(ids: dict[str, int]) -> dict[str, int]:
    """The vision-token keywords of a Qwen-VL / Qwen3.5 config (``image_token_id``, ``video_token_id``,
    ``vision_start_token_id``, ``vision_end_token_id``) from the vocabulary's ids by token
    (:data:`VISION_TOKENS`). Raises ``KeyError`` for a missing token."""
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}


def user_text(item: GraspItem, instruction: str = INSTRUCTION) -> str:
    """The user turn's text: the item's question (with options) plus the instruction.

    RL and SFT rows already carry an instruction in their text (it names the ``<answer>`` tags);
    bench and annotation items get ``instruction`` appended (``""``: nothing appended).
    """
    text = item.question.rstrip()
    if instruction and "<answer>" not in text:
        text = f"{text}\n{instruction}"
    return text


def build_messages(item: GraspItem, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                   instruction: str = INSTRUCTION) -> list[dict]:
    """Chat messages of the prompt (no assistant turn): system, then user with the media first: the
    image (generic QA rows that have one), then the video, then the text (:attr:`GraspItem.media`)."""
    messages: list[dict] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    media = [{"type": kind} for kind in item.media]
    messages.append({"role": "user", "content": [*media, {"type": "text", "text": user_text(item, instruction)}]})
    return messages


def render_texts(processor, item: GraspItem, target: str | None, system_prompt: str,
                 instruction: str = INSTRUCTION) -> tuple[str, str]:
    """Render the prompt text and the target suffix with the processor's chat template.

    The target suffix is what the template writes after the generation prompt for the assistant
    turn (the target plus the end-of-turn markers), so labels start exactly after the generation
    prompt. When the generation prompt already opens the think block (a Qwen3 Thinking template
    ends it with ``<|im_start|>assistant\\n<think>\\n``; :func:`~grasp_lightning.parsing.opens_think`),
    the assistant turn is rendered after the prompt without its ``<think>`` and the suffix is that
    turn with its leading ``<think>`` (and the whitespace after it) removed: prompt + suffix holds
    exactly one ``<think>``, whether the template writes the tag itself or the target carries it.

    Returns:
        ``(prompt_text, target_text)``, or ``(prompt_text, "")`` when ``target`` is ``None``.

    Raises:
        GraspConfigError: if the template renders the prompt (without the opened ``<think>``, for
            a Thinking template) differently once an assistant turn follows (then prompt tokens
            would differ between SFT and generation).
    """
    messages = build_messages(item, system_prompt, instruction)
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if target is None:
        return prompt, ""
    full = processor.apply_chat_template(
        messages + [{"role": "assistant", "content": [{"type": "text", "text": target}]}], tokenize=False
    )
    if not opens_think(prompt):
        if not full.startswith(prompt):
            raise GraspConfigError(
                "the chat template does not render the generation prompt as a prefix of the conversation; "
                "SFT labels cannot be aligned with generation prompts for this template"
            )
        return prompt, full[len(prompt):]
    head = prompt[: prompt.rindex("<think>")]
    if not full.startswith(head):
        raise GraspConfigError(
            "the chat template's generation prompt opens <think>, but the conversation does not start with the "
            "generation prompt before that <think>; SFT labels cannot be aligned with generation prompts"
        )
    turn = full[len(head):]
    if turn.startswith("<think>"):
        turn = turn[len("<think>"):].lstrip()
    return prompt, turn


@dataclass
class EncodedExample:
    """Token ids and vision inputs of one example.

    Attributes:
        input_ids: ``(L,)`` int64, prompt ids followed by target ids.
        labels: ``(L,)`` int64, ``-100`` on prompt tokens, ``None`` for prompt-only examples.
        mm_token_type_ids: ``(L,)`` int64 (0 text, 1 image, 2 video), as the Qwen3-VL processor returns.
        pixel_values_videos: ``(N_patches, C * T_patch * P * P)`` float32 patches of the clip, ``None``
            for an image-only example.
        video_grid_thw: ``(1, 3)`` int64 grid (temporal, height, width) in patches, ``None`` without a clip.
        prompt_length: number of prompt tokens (tokens).
        pixel_values: ``(N_patches, C * T_patch * P * P)`` float32 patches of the image, ``None`` without one.
        image_grid_thw: ``(1, 3)`` int64 grid of the image (temporal 1), ``None`` without one.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor | None
    mm_token_type_ids: torch.Tensor
    pixel_values_videos: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    prompt_length: int
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


def encode_example(processor, item: GraspItem, frames, metadata: dict | None, *, target: str | None,
                   system_prompt: str = DEFAULT_SYSTEM_PROMPT, max_prompt_tokens: int | None = None,
                   max_target_tokens: int | None = None, instruction: str = INSTRUCTION, image: np.ndarray | None = None,
                   max_image_pixels: int | None = None, resize_frames: bool = True) -> EncodedExample:
    """Encode one example: prompt with video and/or image through the processor, target tokens appended.

    Args:
        processor: a transformers processor with a chat template and a video (and image) processor.
        item: the record (its ``origin`` names it in errors); :attr:`GraspItem.media` says what it shows.
        frames: ``(T, H, W, 3)`` uint8 frames already sampled at the configured fps; ``None`` for an
            image-only item.
        metadata: video metadata for the processor (``total_num_frames``, ``fps``,
            ``frames_indices``, ...) so the prompt carries the real timestamps in seconds (``None``
            without frames).
        target: assistant text to learn (SFT) or ``None`` (a prompt for generation).
        system_prompt: the system turn ("" for none).
        max_prompt_tokens: budget for the prompt in tokens, video tokens included.
        max_target_tokens: budget for the target in tokens.
        instruction: appended to questions that carry no instruction (see :func:`user_text`).
        image: ``(H, W, 3)`` uint8 RGB image (:func:`grasp_lightning.data.qa.decode_image`), or ``None``.
        max_image_pixels: cap on the image's pixels (height × width) after the processor's resize: its
            ``max_pixels`` for this call (``images_kwargs={"size": {"longest_edge": ...}}`` of the
            Qwen2-VL/Qwen3-VL image processor, whose ``size`` bounds the total pixels); ``None``: the
            processor's own cap.
        resize_frames: let the video processor resize the frames (its pixel bounds, per-frame cap);
            ``False``: the frames are already sized to whole tokens (``data.video.frame_max_tokens``, the
            released rule) and go in as they are (``do_resize=False``, as the released code passes them).

    Raises:
        TokenBudgetError: the prompt or target is over its budget. A multimodal prompt is never
            truncated: truncation would cut video tokens or the question.
    """
    prompt, suffix = render_texts(processor, item, target, system_prompt, instruction)
    media: dict = {}
    if frames is not None:
        media.update(videos=[frames], video_metadata=[metadata], do_sample_frames=False, cap_pixels_per_frame=True)
        if not resize_frames:
            media["do_resize"] = False
    if image is not None:
        media["images"] = [image]
        if max_image_pixels is not None:
            size = dict(getattr(processor.image_processor, "size", None) or {})
            low = min(int(size.get("shortest_edge", 0)), max_image_pixels)
            media["images_kwargs"] = {"size": {"shortest_edge": low, "longest_edge": max_image_pixels}}
        # (H, W, 3) always: without it a 1- or 3-pixel-tall image is read as channels-first
        media.setdefault("images_kwargs", {})["input_data_format"] = "channels_last"
    enc = processor(text=[prompt], **media, return_tensors="pt")
    prompt_ids = enc["input_ids"][0]
    if max_prompt_tokens is not None and prompt_ids.numel() > max_prompt_tokens:
        knobs = "/".join(k for k, on in (("data.video.fps", frames is not None), ("data.video.max_pixels", frames is not None),
                                         ("data.video.max_image_pixels", image is not None)) if on)
        media_in = " and ".join(m for m, on in (("image", image is not None), ("video", frames is not None)) if on)
        what = f"{media_in} included" if media_in else "text only"
        raise TokenBudgetError(item.origin, f"prompt has {prompt_ids.numel()} tokens ({what}), over the "
                                            f"budget of {max_prompt_tokens}; lower {knobs or 'the question'} or raise "
                                            f"data.prompt.max_prompt_tokens")
    mm_types = enc.get("mm_token_type_ids")
    mm_types = mm_types[0] if mm_types is not None else torch.zeros_like(prompt_ids)
    labels = None
    input_ids = prompt_ids
    if target is not None:
        target_ids = torch.tensor(processor.tokenizer(suffix, add_special_tokens=False)["input_ids"], dtype=torch.long)
        if max_target_tokens is not None and target_ids.numel() > max_target_tokens:
            raise TokenBudgetError(item.origin, f"target has {target_ids.numel()} tokens, over the budget of "
                                                f"{max_target_tokens}")
        input_ids = torch.cat([prompt_ids, target_ids])
        labels = torch.cat([torch.full_like(prompt_ids, IGNORE_INDEX), target_ids])
        mm_types = torch.cat([mm_types, torch.zeros_like(target_ids)])
    return EncodedExample(
        input_ids=input_ids,
        labels=labels,
        mm_token_type_ids=mm_types,
        pixel_values_videos=enc.get("pixel_values_videos"),
        video_grid_thw=enc.get("video_grid_thw"),
        prompt_length=int(prompt_ids.numel()),
        pixel_values=enc.get("pixel_values"),
        image_grid_thw=enc.get("image_grid_thw"),
    )

"""The parts of one GRPO step, by stage (the task that runs them in order: ``tasks/grpo.py``).

- :mod:`~grasp_lightning.grpo.config`: the task's setting groups (reward, advantage, loss, batching, compute).
- sampling: :mod:`~grasp_lightning.grpo.sampling` (a window's rollouts: generation calls, dynamic sampling's
  refill, the window cache kept for resume) and :mod:`~grasp_lightning.grpo.overlap` (the next window sampled
  while this one trains);
  the engines that decode are in :mod:`grasp_lightning.engines`.
- :mod:`~grasp_lightning.grpo.rewards`: the reward terms and the Social Grounding Reward.
- :mod:`~grasp_lightning.grpo.objective`: group advantages, the ratio and its clip, the k3 KL, the loss
  normalisations.
- scoring: :mod:`~grasp_lightning.grpo.scoring` (log-prob forwards over the shared prompt and its K
  completions) and :mod:`~grasp_lightning.grpo.logprobs` (log-probs and entropy in chunks of positions).
- :mod:`~grasp_lightning.grpo.vision`: the vision features, computed once per window.
- :mod:`~grasp_lightning.grpo.rollouts`: the rollout records (completions, rewards, advantages, log-probs)
  and their selection into micro-batches.
"""

"""The sample data generator: a small GRASP-format dataset of synthetic clips plus one real clip.

``python -m grasp_lightning.synthetic.sample_data OUT_DIR [--seed 0] [--real-clip PATH]`` writes it;
the shipped copy is ``grasp_lightning/assets/sample/``. Read the modules in this order:

- :mod:`.drawing` — frames, persons, the object, gaze and gesture drawing, whole clips;
- :mod:`.questions` — :class:`~.questions.Question`, the 16 category templates, the options;
- :mod:`.entries` — a question bound to its clip (:class:`~.entries.Clip`, :class:`~.entries.Entry`):
  letter, reasoning, user turn;
- :mod:`.writer` — rows, annotations, bench json, tar shards, README and
  :func:`~.writer.generate_sample`.

Clips are encoded by :func:`grasp_lightning.synthetic.mp4.encode_mp4`.
"""

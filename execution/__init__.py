"""The execution layer: one run-folder object that owns a stage folder's identity, parts, claims and status
(:mod:`.run_folder`, :mod:`.claims`), one job shape (:mod:`.job`) and the engines that run every job
(:mod:`.engines`: local ranks, independent tasks, Ray). Every stage that writes a folder of parts (score, embed,
basic, dedup's parts, select, a cascade's stages, annotate's draw) is a job behind :func:`.engines.run_job`; see
docs/DESIGN.md, "The execution layer"."""

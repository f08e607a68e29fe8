"""DP fine-tuning (issue 45): DP-SGD (Abadi et al. 2016) on a LoRA adapter (Hu et al. 2022) of
the local generator with label-conditioned prompts (Yue et al., ACL 2023), then sampling the
release from the tuned model. Modules: ``config`` (the ``dp_finetune:`` section),
``accounting`` (the Poisson-subsampled Gaussian and its calibration), ``train`` (the DP-SGD
loop, its checkpoints), ``sample`` (the release) and ``method`` (:class:`DPFineTune`)."""

import os

if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # A rank under torchrun: catch a preemption signal that comes while the imports below run.
    from launcher.protocol import remember_early_preemption

    remember_early_preemption()

from launcher.cli import main  # noqa: E402

raise SystemExit(main())

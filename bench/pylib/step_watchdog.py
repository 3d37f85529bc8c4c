"""A bound on every step of the PyTorch baselines (bench/cluster/ddp_emulate.py, ddp_train.py,
bench/mainjob/ddp_resnet8.py). gloo's own timeout does not cover every hang: DDP's PowerSGD hook
over several buckets in flight hung past it (PyTorch 2.15, 2026-11-29) where it did not abort.
A step that outlasts the bound ends the process with one line naming the step and exit 1."""
import os
import sys
import threading


class StepWatchdog:
    def __init__(self, prog, seconds):
        self.prog, self.seconds, self.timer = prog, seconds, None

    def arm(self, step):
        """Starts the clock of `step` (0-based), stopping the previous step's."""
        self.stop()
        self.timer = threading.Timer(self.seconds, self._fire, (step,))
        self.timer.daemon = True
        self.timer.start()

    def stop(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, step):
        sys.stderr.write(f"{self.prog}: step {step + 1} took more than {self.seconds:g} s "
                         "(a collective that never completes?); stopping\n")
        sys.stderr.flush()
        os._exit(1)

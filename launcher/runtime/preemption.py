"""Preemption inside a rank: SIGUSR1 / SIGTERM / SIGHUP set a flag the loop's StepAgreement all-reduces every step."""

from __future__ import annotations

import signal
from typing import Optional

from launcher.protocol import EARLY_PREEMPTION, PREEMPT_SIGNALS


class PreemptionFlag:
    """Set by SIGUSR1/SIGTERM/SIGHUP in any rank; the loop's StepAgreement all-reduces it every step so all ranks stop together."""

    def __init__(self):
        # A signal recorded while the rank was still importing (launcher/__main__.py) counts as raised.
        self.raised = bool(EARLY_PREEMPTION)
        self.signal_name: Optional[str] = EARLY_PREEMPTION[0] if EARLY_PREEMPTION else None
        for name in PREEMPT_SIGNALS:
            signal.signal(getattr(signal, name), self._handler)

    def _handler(self, signum, _frame):
        self.raised = True
        self.signal_name = signal.Signals(signum).name

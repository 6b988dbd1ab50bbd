"""Learning-rate schedulers used like torch.optim.lr_scheduler's: build one
over an optimizer, call step() after each optimizer.step(). The numbers come
from libvitc (src/train/lr.c)."""
import ctypes

from ._lib import INT64_MAX, check, float_arg, int_arg, lib

__all__ = ["OneCycleLR", "WarmupCosine"]


class _Scheduler:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.last_epoch = 0
        self._apply()

    def step(self):
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self):
        return [self._last_lr]

    def _apply(self):
        lr, mom = self._at(self.last_epoch)
        self.optimizer.lr = lr
        if mom is not None:
            self.optimizer.momentum = mom
        self._last_lr = lr


class OneCycleLR(_Scheduler):
    """torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr, total_steps,
    epochs, steps_per_epoch, pct_start=0.3, anneal_strategy='cos',
    cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
    div_factor=25., final_div_factor=1e4, three_phase=False). Momentum is
    SGD's momentum or AdamW's beta1, as torch."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
            total_steps = int_arg(epochs, "epochs", 1, INT64_MAX) * \
                int_arg(steps_per_epoch, "steps_per_epoch", 1, INT64_MAX)
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError("anneal_strategy must by one of 'cos' or 'linear', instead got %r"
                             % (anneal_strategy,))
        total_steps = int_arg(total_steps, "total_steps", 1, INT64_MAX)
        c = lib.vitc_onecycle_default_config(float_arg(max_lr, "max_lr"), total_steps)
        c.pct_start, c.anneal_linear = float_arg(pct_start, "pct_start"), int(anneal_strategy == "linear")
        c.div_factor = float_arg(div_factor, "div_factor")
        c.final_div_factor = float_arg(final_div_factor, "final_div_factor")
        c.three_phase, c.cycle_momentum = int(bool(three_phase)), int(bool(cycle_momentum))
        c.base_momentum = float_arg(base_momentum, "base_momentum")
        c.max_momentum = float_arg(max_momentum, "max_momentum")
        self._c = c
        self.total_steps = total_steps
        super().__init__(optimizer)

    def _at(self, step):
        lr, mom = ctypes.c_double(), ctypes.c_double()
        check(lib.vitc_lr_onecycle(ctypes.byref(self._c), int(step), ctypes.byref(lr),
                                   ctypes.byref(mom)))
        return lr.value, (mom.value if self._c.cycle_momentum else None)


class WarmupCosine(_Scheduler):
    """Linear warmup over warmup_steps, then cosine to min_lr at total_steps
    (the formula of vitc_lr_warmup_cosine in vitc.h). base_lr is the
    optimizer's lr when the scheduler is built."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        self.base_lr = optimizer.lr
        self.warmup_steps = int_arg(warmup_steps, "warmup_steps", 0, INT64_MAX)
        self.total_steps = int_arg(total_steps, "total_steps", 1, INT64_MAX)
        self.min_lr = float_arg(min_lr, "min_lr")
        super().__init__(optimizer)

    def _at(self, step):
        lr = ctypes.c_double()
        check(lib.vitc_lr_warmup_cosine(int(step), self.warmup_steps, self.total_steps,
                                        self.base_lr, self.min_lr, ctypes.byref(lr)))
        return lr.value, None

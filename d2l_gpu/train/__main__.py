"""`python -m d2l_gpu.train`: the training script of lesson 7 (see d2l_gpu.train.loop)."""

from ..distributed import end_process
from ..stopping import stop_on_signals
from .loop import main

stop_on_signals()
end_process(main())

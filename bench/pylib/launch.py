"""The rank and world size of a PyTorch baseline launched by MPICH's hydra (PMI_RANK / PMI_SIZE)
or torchrun (RANK / WORLD_SIZE): one reading for bench/cluster/ddp_emulate.py, ddp_train.py and
bench/mainjob/ddp_resnet8.py."""
import os
import sys


def launch_env():
    """(rank, world size) from the launcher's environment, else (0, 1); ValueError naming the
    variables when they are not two integers with 0 <= rank < size."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE")):
        if rank_var in os.environ or size_var in os.environ:
            try:
                rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            except (KeyError, ValueError):
                raise ValueError(f"launcher environment: {rank_var}/{size_var} are not two integers")
            if not (size >= 1 and 0 <= rank < size):
                raise ValueError(f"launcher environment: rank {rank} of {size} is out of range")
            return rank, size
    return 0, 1


def launch_env_or_exit(prog):
    """launch_env(), or one line on stderr and exit 2."""
    try:
        return launch_env()
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)

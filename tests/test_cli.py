"""pipeline/cli.py: what every entry script does on its way out."""

import pytest

from pipeline.cli import end_process_group, run_main


def test_the_process_group_is_destroyed_however_main_ends(tmp_path):
    import torch.distributed as dist

    def main_that_fails(argv):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        raise ValueError("bad setting")

    with pytest.raises(SystemExit) as ended:
        run_main(main_that_fails)
    assert ended.value.code == 2 and not dist.is_initialized()
    end_process_group()  # nothing joined: nothing to do, no error

"""init() attaches the speed features exactly when the job's contract asks for them."""


import pytest

from hetero_worker.trainer import wants_speed_features
from heterotrain_common import contract as c


def _contract(**comm):
    """A one-rank contract whose comm settings differ from the defaults by ``comm``."""
    topo = (c.RankEntry(rank=0, group=0, node="n", gpu_product="A100", compute_capability="8.0", local_batch=4),)
    return c.Contract(
        dist=c.RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1",
                        master_port=29500, job_name="j", group=0, group_rank=0, group_size=1),
        precision="fp32",
        comm=c.CommSettings(**{"hierarchy": "group", **comm}),
        device=c.DeviceProfile(product="A100"), topology=topo)


@pytest.mark.parametrize(
    ("over", "expected"),
    [({}, False), ({"rebalance_interval_steps": 10}, True), ({"compression": "int8"}, True),
     ({"hierarchy": "auto"}, True), ({"hierarchy": "flat"}, False)],
    ids=["static job keeps the plain trainer", "rebalancing", "compression", "auto hierarchy",
         "flat hierarchy"],
)
def test_speed_features_follow_the_contract(over, expected):
    assert wants_speed_features(_contract(**over)) is expected

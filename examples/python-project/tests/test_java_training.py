"""Java training (the gradbridge plugin's fixtures) equals eager PyTorch, epoch by epoch."""

import numpy as np
import pytest

from gradbridge.pytest_plugin import assert_histories_match


@pytest.fixture
def exported(tmp_path):
    import torch

    from gradbridge import export_training_module
    from regressor import make_regressor

    torch.manual_seed(0)
    model = make_regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1 * rng.normal(size=(64, 1))).astype(np.float32)
    path = export_training_module(model, torch.nn.MSELoss(), optimizer, tmp_path / "regressor.pt",
                                  example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])))
    return path, x, y


def test_java_training_equals_python(exported, java_trainer):
    from gradbridge import reference
    from regressor import make_regressor

    path, x, y = exported
    # the eager side is your own nn.Module (its initial tensors are the export's) and torch.optim
    python = reference.train(path, x, y, epochs=4, batch_size=16, seed=1, model=make_regressor())
    java = java_trainer(path, x, y, epochs=4, batch_size=16, seed=1)
    assert_histories_match(python, java)          # rtol = atol = 0: bit for bit
    assert java[-1].loss < java[0].loss


def test_the_plugin_costs_nothing_without_its_fixtures(pytester):
    """A test that uses no gradbridge fixture: the plugin loads, torch, numpy and JPype do not."""
    pytester.makepyfile("""
        import sys

        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("gradbridge")
            assert not {"torch", "numpy", "jpype"} & set(sys.modules), sorted(sys.modules)
    """)
    pytester.runpytest_subprocess("-p", "no:faulthandler").assert_outcomes(passed=1)

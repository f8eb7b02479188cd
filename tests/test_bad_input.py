"""Bad input reaches Python as a clear gradbridge error, and the JVM stays usable after each."""

from __future__ import annotations

import jpype
import numpy as np
import pytest

from gradbridge import java
from gradbridge import InvalidInputError, JavaBuildMissingError, ProtocolError, TrainingError
from gradbridge.errors import ModuleLoadError
from gradbridge._runtime import classpath
from gradbridge import jvm as gradbridge_jvm


@pytest.fixture
def module(jvm, model_path):
    handle = jvm.load_module(model_path)
    yield handle
    handle.close()


def _array(module, values, shape, dtype=np.float32):
    """A Java Tensor (freed by the JVM when unreachable)."""
    return gradbridge_jvm.to_tensor(np.asarray(values, dtype=dtype).reshape(shape))


def _still_trains(jvm, model_path):
    x, y = java.seed_data(n=8)
    history = java.train(model_path, x, y, epochs=2, mode="full", lr=0.01)
    assert len(history) == 2


def test_missing_file(jvm, tmp_path, model_path):
    with pytest.raises(ModuleLoadError, match=r"absent\.pt \(file not found\)"):
        jvm.load_module(tmp_path / "absent.pt")
    _still_trains(jvm, model_path)


def test_not_torchscript(jvm, models, model_path):
    with pytest.raises(ModuleLoadError, match=r"not_torchscript\.pt is not a TorchScript file"):
        jvm.load_module(models["not_torchscript.pt"])
    _still_trains(jvm, model_path)


def test_torchscript_without_protocol(jvm, models, model_path):
    with pytest.raises(ProtocolError, match=r"no_protocol\.pt is a TorchScript module without gradbridge\.json"):
        jvm.load_module(models["no_protocol.pt"])
    with pytest.raises(ProtocolError, match=r"missing_methods\.pt lacks protocol methods \[calculate_loss_and_backward"):
        jvm.load_module(models["missing_methods.pt"])
    _still_trains(jvm, model_path)


def test_unknown_method(jvm, module, model_path):
    with pytest.raises(ProtocolError, match=r"has no method 'train_faster'; its methods: \[buffer_names, calculate_loss_and_backward"):
        with gradbridge_jvm.java_errors():
            module.call("train_faster")
    assert len(module.getParameters()) == 2
    _still_trains(jvm, model_path)


def test_wrong_shape(jvm, module, model_path):
    x = _array(module, [1, 2, 3], [3])
    y = _array(module, [1, 2, 3], [3, 1])
    with pytest.raises(InvalidInputError, match=r"input x must be float32 of shape \[-1, 1\] .* got float32 of shape \[3\]"):
        with gradbridge_jvm.java_errors():
            module.calculateLossAndBackward(x, y)
    _still_trains(jvm, model_path)


def test_wrong_dtype(jvm, module, model_path):
    x = _array(module, [1, 2], [2, 1])
    y = _array(module, [1, 2], [2, 1], dtype=np.float64)
    with pytest.raises(InvalidInputError, match=r"input y must be float32 .* got float64 of shape \[2, 1\]"):
        with gradbridge_jvm.java_errors():
            module.calculateLossAndBackward(x, y)
    _still_trains(jvm, model_path)


def test_error_from_inside_libtorch_keeps_the_jvm_usable(jvm, module, model_path):
    x = _array(module, [1, 2, 3], [3, 1])
    y = _array(module, [1, 2], [2, 1])
    with pytest.raises(TrainingError, match=r"The size of tensor a \(3\) must match the size of tensor b \(2\)") as info:
        with gradbridge_jvm.java_errors():
            module.call("calculate_loss_and_backward", jpype.JArray(jpype.JObject)([x, y]))
    assert info.value.java_class == "dev.gradbridge.MethodCallException"
    _still_trains(jvm, model_path)


@pytest.mark.parametrize("mode", ["full", "step", "fused"])
def test_a_label_outside_the_classes_is_the_datas_line_in_both_languages(jvm, models, model_path, mode):
    """The same bad input, the same line from java.train and reference.train: it names the data and the array,
    the value and the classes the model takes (libtorch's "Target 7 is out of bounds" names neither), not the
    module; so does a label outside the classes in the validation data."""
    from gradbridge import messages, reference

    x = np.zeros((10, 4), np.float32)
    y = np.full(10, 7, np.int64)  # the model has 3 classes
    def line(error):  # without the Java class a Java error names after its message
        text = str(error)
        return text[:-len(f" [{error.java_class}]")] if error.java_class else text

    for train in (java.train, reference.train):
        with pytest.raises(InvalidInputError) as info:
            train(models["mlp_classifier.pt"], x, y, epochs=1, batch_size=5, mode=mode)
        assert line(info.value) == messages.value_out_of_range("training data", "y", None, 7, 0, 2), train
        with pytest.raises(InvalidInputError) as info:
            train(models["mlp_classifier.pt"], x, y % 3, epochs=1, batch_size=5, mode=mode, val=(x, y - 10),
                  val_source="val.npz")
        assert line(info.value) == messages.value_out_of_range("val.npz", "y", None, -3, 0, 2), train
    _still_trains(jvm, model_path)


def test_missing_java_build_names_the_command(monkeypatch, tmp_path):
    monkeypatch.delenv(classpath.CLASSPATH_ENV, raising=False)
    monkeypatch.setattr(classpath._devtree, "root", lambda: tmp_path)
    with pytest.raises(JavaBuildMissingError, match=r"gradbridge-classpath\.txt is missing; build it with `gradle assemble`"):
        classpath.resolve()


def test_stale_java_build_names_the_missing_jar(monkeypatch, tmp_path):
    monkeypatch.setenv(classpath.CLASSPATH_ENV, str(tmp_path / "gone.jar"))
    with pytest.raises(JavaBuildMissingError, match=r"GRADBRIDGE_CLASSPATH names files that do not exist: .*gone\.jar; "
                                                    r"correct or unset GRADBRIDGE_CLASSPATH"):
        classpath.resolve()


def test_classpath_with_a_corrupt_jar_names_it(monkeypatch, tmp_path):
    bad = tmp_path / "gradbridge.jar"
    bad.write_text("not a zip")
    monkeypatch.setenv(classpath.CLASSPATH_ENV, str(bad))
    with pytest.raises(JavaBuildMissingError, match=r"names .*gradbridge\.jar, which is not a readable jar"):
        classpath.resolve().versions()


def test_classpath_without_the_library_says_so(monkeypatch, tmp_path):
    other = tmp_path / "other.jar"
    import zipfile

    with zipfile.ZipFile(other, "w") as jar:
        jar.writestr("a/B.class", b"")
    monkeypatch.setenv(classpath.CLASSPATH_ENV, str(other))
    with pytest.raises(JavaBuildMissingError, match=r"holds no gradbridge jar \(none contains dev/gradbridge/versions"):
        classpath.resolve().versions()

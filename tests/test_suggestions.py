"""The one "did you mean" of the errors about unknown names."""

from nbscale.suggestions import close_names, did_you_mean


def test_did_you_mean_names_the_closest_name_as_a_sentence_to_append():
    assert did_you_mean("momentun", ["momentum", "max_epochs"]) == " Did you mean 'momentum'?"


def test_did_you_mean_lists_up_to_n_close_names_closest_first():
    names = ["layer4.1.conv1", "layer4.1.conv2", "layer4.1.bn1", "fc"]
    assert did_you_mean("layer4.1.con1", names, n=2) == " Did you mean 'layer4.1.conv1', 'layer4.1.conv2'?"


def test_did_you_mean_is_empty_when_no_name_is_close():
    assert did_you_mean("zzz", ["momentum", "max_epochs"]) == ""


def test_a_known_mistake_names_what_was_meant_before_any_close_name():
    assert did_you_mean("f1", ["fscore", "f1x"], meant={"f1": "fscore"}) == " Did you mean 'fscore'?"


def test_close_names_follows_the_cutoff():
    assert close_names("mse2", ["mse", "l1"], cutoff=0.5) == ["mse"]
    assert close_names("mse2", ["mse", "l1"], cutoff=0.9) == []

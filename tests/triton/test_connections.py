"""triton.connections: parsed with the project's input rules, rendered as tritonserver options."""
import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms

from .conftest import dump, profile_dict


def section(tmp_path, **conn):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    if conn:
        doc["triton"]["connections"] = conn
    return parse_profile_text(dump(doc), "t.yaml").section("triton")


def test_defaults_keep_connections_long_lived(tmp_path):
    args = forms.server_args(section(tmp_path))
    assert "--grpc-keepalive-time=60000" in args and "--grpc-keepalive-permit-without-calls=1" in args
    assert not any(a.startswith("--http-thread-count") for a in args)   # Triton's own default unless set


def test_set_values(tmp_path):
    args = forms.server_args(section(tmp_path, http_thread_count=16, grpc_keepalive_permit_without_calls=False,
                                      grpc_keepalive_time_ms=30000))
    assert {"--http-thread-count=16", "--grpc-keepalive-permit-without-calls=0", "--grpc-keepalive-time=30000"} <= set(args)


@pytest.mark.parametrize("conn, msg", [({"grpc_keepalive_time": 1}, "did you mean 'grpc_keepalive_time_ms'"),
                                       ({"http_thread_count": 0}, "expected an integer 1-1024"),
                                       ({"grpc_keepalive_permit_without_calls": "yes please"}, "true or false")])
def test_bad_values_name_the_key(tmp_path, conn, msg):
    with pytest.raises(ProfileError) as e:
        section(tmp_path, **conn)
    assert "triton.connections." in str(e.value) and msg in str(e.value) and str(e.value).startswith("t.yaml:")


def test_extra_args_may_not_repeat_them(tmp_path):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"]["extra_args"] = ["--grpc-keepalive-time=5"]
    with pytest.raises(ProfileError) as e:
        parse_profile_text(dump(doc), "t.yaml")
    assert "connections.grpc_keepalive_time_ms" in str(e.value)

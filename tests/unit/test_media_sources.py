"""multimodal.sources: local paths and data: URIs behind their guards (http(s) URLs: test_media_urls.py)."""
from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from mindie_service.netguard import FetchPolicy
from multimodal import MediaPolicy
from mindie_service.devkit import synth
from tests.media_helpers import PNG, fetch, refused

# ---------------------------------------------------------------------------------------------
# Local paths


@pytest.fixture()
def folders(tmp_path: Any) -> dict[str, Any]:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "sub").mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (allowed / "sub" / "b.png").write_bytes(PNG)
    (allowed / "big.png").write_bytes(PNG + b"\0" * 5000)
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    sibling = tmp_path / "allowed2"
    sibling.mkdir()
    (sibling / "c.png").write_bytes(PNG)
    os.symlink(secret, allowed / "link_out.png")
    os.symlink(allowed / "sub" / "b.png", allowed / "link_in.png")
    os.symlink(tmp_path, allowed / "dir_out")
    policy = MediaPolicy(FetchPolicy(allowed_local_paths=(str(allowed),)))
    return {"allowed": allowed, "secret": secret, "policy": policy, "tmp": tmp_path}


def test_local_path_inside_allowed_folder_is_read(folders: dict[str, Any]) -> None:
    assert fetch(str(folders["allowed"] / "a.png"), folders["policy"]) == PNG
    assert fetch(str(folders["allowed"] / "sub" / "b.png"), folders["policy"]) == PNG


def test_file_uri_with_empty_host_is_read(folders: dict[str, Any]) -> None:
    assert fetch("file://" + str(folders["allowed"] / "a.png"), folders["policy"]) == PNG


def test_symlink_staying_inside_allowed_folder_is_read(folders: dict[str, Any]) -> None:
    assert fetch(str(folders["allowed"] / "link_in.png"), folders["policy"]) == PNG


def test_dotdot_component_is_refused(folders: dict[str, Any]) -> None:
    err = refused(str(folders["allowed"]) + "/../secret.png", folders["policy"])
    assert err.status == 403 and "'..'" in err.message


def test_percent_encoded_traversal_is_refused(folders: dict[str, Any]) -> None:
    for enc in ("%2e%2e", "%2E%2E", "%252e%252e", ".%2e"):
        err = refused(f"{folders['allowed']}/{enc}/secret.png", folders["policy"])
        assert err.status == 403 and "percent-encoded" in err.message
    err = refused(f"file://{folders['allowed']}/%2e%2e/secret.png", folders["policy"])
    assert err.status == 403


def test_symlink_out_of_allowed_folder_is_refused(folders: dict[str, Any]) -> None:
    err = refused(str(folders["allowed"] / "link_out.png"), folders["policy"])
    assert err.status == 403 and "outside the allowed folders" in err.message
    err = refused(str(folders["allowed"] / "dir_out" / "secret.png"), folders["policy"])
    assert err.status == 403


def test_sibling_folder_sharing_a_name_prefix_is_refused(folders: dict[str, Any]) -> None:
    err = refused(str(folders["tmp"] / "allowed2" / "c.png"), folders["policy"])
    assert err.status == 403


def test_file_uri_with_host_is_refused(folders: dict[str, Any]) -> None:
    err = refused("file://fileserver" + str(folders["allowed"] / "a.png"), folders["policy"])
    assert err.status == 403 and "host" in err.message
    refused("file://localhost" + str(folders["allowed"] / "a.png"), folders["policy"])


def test_local_paths_refused_when_no_folder_is_allowed(folders: dict[str, Any]) -> None:
    err = refused(str(folders["allowed"] / "a.png"), MediaPolicy())
    assert err.status == 403


def test_missing_file_inside_folder_is_404_and_outside_is_403(folders: dict[str, Any]) -> None:
    assert refused(str(folders["allowed"] / "nope.png"), folders["policy"]).status == 404
    assert refused(str(folders["tmp"] / "nope.png"), folders["policy"]).status == 403


def test_relative_path_and_directory_are_refused(folders: dict[str, Any]) -> None:
    assert refused("allowed/a.png", folders["policy"]).status == 422
    assert "not a regular file" in refused(str(folders["allowed"] / "sub"),
                                           folders["policy"]).message


def test_local_file_over_cap_is_refused_before_reading(folders: dict[str, Any]) -> None:
    policy = MediaPolicy(FetchPolicy(allowed_local_paths=(str(folders["allowed"]),)), max_image_bytes=4096)
    err = refused(str(folders["allowed"] / "big.png"), policy)
    assert err.status == 413


def test_png_renamed_mp4_sent_as_video_is_refused_naming_its_format(
        folders: dict[str, Any]) -> None:
    path = folders["allowed"] / "clip.mp4"
    path.write_bytes(PNG)
    err = refused(str(path), folders["policy"], kind="video", index=2)
    assert err.status == 415 and "PNG image" in err.message


def test_unsupported_scheme_is_refused() -> None:
    err = refused("ftp://127.0.0.1/a.png", MediaPolicy())
    assert err.status == 422 and "ftp" in err.message


# ---------------------------------------------------------------------------------------------
# data: URIs


def data_uri(data: bytes, mediatype: str = "image/png") -> str:
    return f"data:{mediatype};base64," + base64.b64encode(data).decode()


def test_data_uri_image_is_decoded() -> None:
    assert fetch(data_uri(PNG), MediaPolicy()) == PNG
    jpeg = synth.image_bytes(fmt="JPEG")
    assert fetch(data_uri(jpeg, "image/jpeg"), MediaPolicy()) == jpeg


def test_huge_base64_is_refused_from_its_length() -> None:
    policy = MediaPolicy(max_image_bytes=1024 * 1024)
    # Not valid base64 at all: proves the cap is checked before any decoding.
    err = refused("data:image/png;base64," + "!" * (2 * 1024 * 1024), policy)
    assert err.status == 413


def test_data_uri_wrong_type_or_encoding_is_refused() -> None:
    assert refused(data_uri(PNG, "text/plain"), MediaPolicy()).status == 415
    assert refused(data_uri(PNG, "image/png"), MediaPolicy(), kind="audio").status == 415
    assert refused("data:image/png,rawbytes", MediaPolicy()).status == 422
    assert refused("data:image/png;base64,@@@@", MediaPolicy()).status == 422

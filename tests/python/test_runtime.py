"""The extension loads and its std::filesystem calls bind to the system libstdc++, not to the
copy pip's torch exports (pytorch/pytorch#133437; see CMakeLists.txt)."""
import orthopt


def test_filesystem_binds_to_system_libstdcxx():
    assert "libstdc++" in orthopt._C.filesystem_provider()

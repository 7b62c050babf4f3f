"""Every environment variable the code reads is documented in the README's table."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READ = re.compile(r"""(?:environ\.get\(|getenv\(|environ\[)\s*["']([A-Z][A-Z0-9_]+)["']""")
NAMED = re.compile(r"""["'](WORKBENCH_[A-Z0-9_]+)["']""")  # names passed around as constants (ENV_FOLDERS)


def test_every_environment_variable_the_code_reads_is_in_the_readme():
    sources = [p for folder in ("workbench", "apps", "kernels") for p in (ROOT / folder).rglob("*.py")]
    read = set()
    for path in sources:
        text = path.read_text()
        read |= set(READ.findall(text)) | set(NAMED.findall(text))
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    assert {"WORKBENCH_CACHE", "TRITON_INTERPRET", "WORKBENCH_APP_SAES"} <= read  # the scan finds them
    assert not read - documented, f"undocumented: {sorted(read - documented)}"

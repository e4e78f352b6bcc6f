# The two commands of the README: `make demo` and `make test`.
# Both run `make setup` first, which is idempotent and quick once done.
SHELL := /bin/bash
VENV  := .venv

.PHONY: setup demo test unit bench shim clean

setup:
	@bash scripts/setup.sh

shim:
	@$(MAKE) -s -C hijack

demo: setup
	@bash scripts/demo.sh

test: setup
	@$(VENV)/bin/python -m pytest tests

unit: setup
	@$(VENV)/bin/python -m pytest tests/unit

# (pip writes the console scripts anew: setup runs again to take their
# `import re` out, or the first bench of a venv measured ~5 ms more per command)
bench: setup
	@$(VENV)/bin/python -c 'import matplotlib' 2>/dev/null || { \
		$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[bench]' \
			--config-settings editable_mode=compat && bash scripts/setup.sh; }
	@$(VENV)/bin/python scripts/bench/run.py

clean:
	@$(MAKE) -s -C hijack clean
	rm -rf $(VENV) *.egg-info

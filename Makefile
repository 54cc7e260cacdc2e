# Quiver: the two quick-start commands and the pieces behind them.
.PHONY: demo test bench fmt

demo: ## Build the server, serve examples/tools.yaml, call a tool with the official MCP client
	./scripts/demo.sh

test: ## The full test command (what CI runs)
	./scripts/test.sh

bench: ## Criterion benchmarks of the dispatch path (results: docs/performance.md)
	cargo bench -p quiver-server --bench dispatch

fmt:
	cargo fmt --all

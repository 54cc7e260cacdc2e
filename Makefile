# Quiver: the two quick-start commands and the pieces behind them.
.PHONY: demo up down test e2e images release bench bench-wire pgo fmt

demo: ## Build the server, serve examples/tools.yaml, call a tool with the official MCP client
	./scripts/demo.sh

up: ## The whole system on a local kind cluster: operator, a sample McpServer, a tool call
	./scripts/up.sh

down: ## Delete the kind cluster made by make up
	./scripts/down.sh

images: ## Build the quiver-server and quiver-operator images (no registry needed)
	./scripts/images.sh

release: ## Build, sign and push a release: make release VERSION=0.2.0 REGISTRY=registry.example.com/quiver COSIGN_KEY=cosign.key (docs/install.md)
	COSIGN_KEY="$(COSIGN_KEY)" ./scripts/release.sh "$(VERSION)" "$(REGISTRY)"

e2e: ## Only the end-to-end suite on kind
	./scripts/e2e.sh

test: ## The full test command (what CI runs)
	./scripts/test.sh

bench: ## Criterion benchmarks of the dispatch path (results: docs/performance.md)
	cargo bench -p quiver-server --bench dispatch

bench-wire: ## Over the wire: quiver-server vs rmcp, the TS/Python/Go SDKs and two axum ceilings (writes docs/performance.md)
	./scripts/bench-wire.sh

pgo: ## Regenerate the PGO profile the server image is built with (deploy/images/pgo/)
	./scripts/pgo.sh

fmt:
	cargo fmt --all

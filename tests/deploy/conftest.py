"""Fixtures of the deployment tests: every overlay rendered once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.deploy.k8s import K8S, OVERLAYS_DIR, Rendered, overlay_names, render

# Not an overlay of the repository: what an operator writes to run the sample workers (or their
# own, built the same way) beside the prod coordinators. Rendering it checks that the worker
# component fits prod's coordinator too.
PROD_WITH_WORKERS = "prod+sample-workers"


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    out: dict[str, Rendered] = {}
    for name in overlay_names():
        path = OVERLAYS_DIR / name
        text, objects = render(path)
        out[name] = Rendered(name, text, objects, path)
    if "prod" in out:
        prod_ns = {o["metadata"]["name"] for o in out["prod"].all("Namespace")}
        assert len(prod_ns) == 1, "the prod overlay should create exactly one Namespace"
        folder = tmp_path_factory.mktemp("prod-with-workers")
        rel = Path(os.path.relpath(K8S, folder))
        (folder / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\n"
            "kind: Kustomization\n"
            f"namespace: {prod_ns.pop()}\n"
            f"resources: [{rel / 'overlays' / 'prod'}]\n"
            f"components: [{rel / 'components' / 'sample-workers'}]\n"
        )
        text, objects = render(folder)
        out[PROD_WITH_WORKERS] = Rendered(PROD_WITH_WORKERS, text, objects, folder)
    return out

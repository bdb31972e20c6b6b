"""Fixtures of the deployment tests: every overlay rendered once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.deploy.k8s import K8S, OVERLAYS_DIR, Obj, Rendered, overlay_names, render

# Not overlays of the repository: what an operator writes to run the sample workers (or their
# own, built the same way) beside the prod coordinators, without and with TLS. Rendering them
# checks that the worker component fits prod's coordinator too, and that the TLS component fits
# prod (the dev-tls overlay puts it on top of dev).
PROD_WITH_WORKERS = "prod+sample-workers"
PROD_WITH_WORKERS_TLS = "prod+sample-workers+tls-cert-manager"
# prod with the optional monitoring component (and the sample workers, whose pods the dashboard
# shows).
PROD_WITH_MONITORING = "prod+sample-workers+monitoring"


def render_combination(
    folder: Path, namespace: str, resources: list[str], components: list[str]
) -> tuple[str, list[Obj]]:
    """Render a kustomization written into `folder` that takes `resources` and `components`
    (paths relative to deploy/k8s) into `namespace`."""
    rel = Path(os.path.relpath(K8S, folder))
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"namespace: {namespace}\n"
        f"resources: [{', '.join(str(rel / r) for r in resources)}]\n"
        f"components: [{', '.join(str(rel / c) for c in components)}]\n"
    )
    return render(folder)


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
        namespace = prod_ns.pop()
        for name, components in (
            (PROD_WITH_WORKERS, ["components/sample-workers"]),
            (
                PROD_WITH_WORKERS_TLS,
                ["components/sample-workers", "components/tls-cert-manager"],
            ),
            (PROD_WITH_MONITORING, ["components/sample-workers", "components/monitoring"]),
        ):
            folder = tmp_path_factory.mktemp(name.replace("+", "-"))
            text, objects = render_combination(folder, namespace, ["overlays/prod"], components)
            out[name] = Rendered(name, text, objects, folder)
    return out

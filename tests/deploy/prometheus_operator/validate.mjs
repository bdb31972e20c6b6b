// Validates Prometheus Operator objects (monitoring.coreos.com/v1) against the JSON schemas that
// @kubernetes-models/prometheus-operator ships (generated from the operator's API types, which
// its CRDs' openAPIV3Schema are generated from too). Reads a JSON array of objects on stdin,
// writes a JSON array of {kind, name, errors} on stdout (errors empty when valid).
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const results = objects.map((obj) => {
  const name = obj?.metadata?.name ?? "";
  const Model = obj?.apiVersion === "monitoring.coreos.com/v1" ? v1[obj.kind] : undefined;
  if (typeof Model !== "function") {
    return { kind: obj?.kind, name, errors: [`no schema for ${obj?.apiVersion} ${obj?.kind}`] };
  }
  try {
    new Model(obj).validate();
    return { kind: obj.kind, name, errors: [] };
  } catch (error) {
    const details = (error.errors ?? []).map(
      (e) => `${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params ?? {})}`,
    );
    return { kind: obj.kind, name, errors: details.length ? details : [String(error.message)] };
  }
});
process.stdout.write(JSON.stringify(results));

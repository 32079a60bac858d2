{{- /* The rendered objects come from `python tools/kubeflow_install.py chart DIR`, never from git. */ -}}
{{- define "trainjob-pipeline.file" -}}
{{- $content := .root.Files.Get .path -}}
{{- if not $content -}}
{{- fail (printf "%s is missing: this chart is assembled by `python tools/kubeflow_install.py chart DIR` (trainjob-pipeline repository) and installed from DIR" .path) -}}
{{- end -}}
{{- $content -}}
{{- end -}}

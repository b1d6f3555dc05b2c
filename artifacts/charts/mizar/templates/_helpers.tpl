{{/* Name prefix of every object: the release name unless nameOverride is set. */}}
{{- define "mizar.fullname" -}}
{{- default .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "mizar.labels" -}}
app.kubernetes.io/part-of: mizar
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "mizar.apiserverSelector" -}}
app.kubernetes.io/name: mizar-apiserver
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Service the APIServices point at; the serving certificate must name it. */}}
{{- define "mizar.serviceName" -}}{{ include "mizar.fullname" . }}-apiserver{{- end -}}
{{- define "mizar.serviceDNS" -}}{{ include "mizar.serviceName" . }}.{{ .Release.Namespace }}.svc{{- end -}}

{{- define "mizar.servingSecret" -}}
{{- if eq .Values.tls.mode "secrets" -}}{{ .Values.tls.existingServingSecret }}{{- else -}}{{ include "mizar.fullname" . }}-serving{{- end -}}
{{- end -}}

{{- define "mizar.etcdClientSecret" -}}
{{- if eq .Values.etcd.mode "external" -}}{{ .Values.etcd.clientSecret }}{{- else -}}{{ include "mizar.fullname" . }}-etcd-client{{- end -}}
{{- end -}}

{{- define "mizar.etcdServers" -}}
{{- if eq .Values.etcd.mode "external" -}}{{ join "," .Values.etcd.servers }}
{{- else if .Values.apiserver.hostNetwork -}}https://127.0.0.1:{{ .Values.etcd.bundled.clientPort }}
{{- else -}}https://{{ include "mizar.fullname" . }}-etcd.{{ .Release.Namespace }}.svc:{{ .Values.etcd.bundled.clientPort }}{{- end -}}
{{- end -}}

{{/* Served API groups (v1alpha1 each): one APIService per group version. */}}
{{- define "mizar.groups" -}}
{{- $gvs := list "networking.mizar.dev" -}}
{{- if .Values.broker.enabled -}}{{- $gvs = append $gvs "broker.mizar.dev" -}}{{- end -}}
{{- join " " $gvs -}}
{{- end -}}

{{- define "mizar.conflistName" -}}10-mizar.conflist{{- end -}}

{{/* The conflist the agents install: mizar, then portmap for hostPorts.
cniVersion 1.0.0: containerd 1.6/1.7 cannot read 1.1.0 results. */}}
{{- define "mizar.conflist" -}}
{
  "cniVersion": "1.0.0",
  "name": "mizar",
  "plugins": [
    {"type": "mizar", "vpc": {{ .Values.defaultVpc.name | quote }}, "subnet": {{ (index .Values.defaultSubnets 0).name | quote }}{{ if .Values.agent.mtu }}, "mtu": {{ .Values.agent.mtu }}{{ end }}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
{{- end -}}

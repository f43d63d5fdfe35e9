{{/* Labels of every object: the component's name, Baton's, and Helm's bookkeeping. */}}
{{- define "baton.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: baton
{{- end }}

{{- define "baton.release" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of an object that is no component (RBAC, ConfigMaps). */}}
{{- define "baton.partOf" -}}
app.kubernetes.io/part-of: baton
{{ include "baton.release" . }}
{{- end }}

{{/* dra or deviceplugin: the kubeletPlugin value, `auto` decided by the API's capabilities. */}}
{{- define "baton.kubeletPlugin" -}}
{{- if eq .Values.kubeletPlugin "auto" -}}
{{- $v1 := .Capabilities.APIVersions.Has "resource.k8s.io/v1" -}}
{{- if and $v1 (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) }}dra{{ else }}deviceplugin{{ end -}}
{{- else -}}
{{- .Values.kubeletPlugin -}}
{{- end -}}
{{- end }}

{{- define "baton.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The second kube-scheduler's image: the tag given, else the API server's own version
(kube-scheduler may be neither newer than its API server nor more than one minor older:
version-skew policy). The DRA path needs kube-scheduler 1.36 or later (it allocates the claims
with consumable capacity and maps baton.dev/gpu onto them, both on by default from 1.36): below
1.36 it takes v1.36.2, and a version tag below it is refused, since that scheduler would leave
every GPU pod Pending. */}}
{{- define "baton.schedulerImage" -}}
{{- $dra := eq (include "baton.kubeletPlugin" .) "dra" -}}
{{- $default := ternary "v1.36.2" "v1.32.2" $dra -}}
{{- $server := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if and $server (or (not $dra) (semverCompare ">=1.36.0-0" $server)) }}
{{- $default = printf "v%s" (trimPrefix "v" $server) }}
{{- end }}
{{- $tag := .Values.schedulerImage.tag | default $default -}}
{{- if and $dra (regexMatch "^v?[0-9]+\\.[0-9]+(\\.[0-9]+)?([-+].*)?$" $tag) }}
{{- if semverCompare "<1.36.0-0" $tag }}
{{- $path := ternary "auto, on a cluster of 1.36 or later serving resource.k8s.io/v1" .Values.kubeletPlugin (eq .Values.kubeletPlugin "auto") }}
{{- fail (printf "schedulerImage.tag %s: the DRA path (kubeletPlugin %s) needs kube-scheduler 1.36 or later, which allocates claims with consumable capacity and maps baton.dev/gpu onto them; leave the tag \"\" for v1.36.2, or set kubeletPlugin=deviceplugin" $tag $path) }}
{{- end }}
{{- end -}}
image: {{ printf "%s:%s" .Values.schedulerImage.repository $tag | quote }}
{{- with .Values.schedulerImage.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* Node daemons' pod placement and runtime. */}}
{{- define "baton.nodePod" -}}
{{- with .Values.gpu.nvidia.runtimeClassName }}
{{- if eq $.Values.gpu.backend "nvidia" }}
runtimeClassName: {{ . }}
{{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Host networking: the pod's network fields. ClusterFirstWithHostNet, since Default (and
ClusterFirst, which the kubelet turns into Default on the host's network) cannot resolve the
Services the agents and kube-scheduler dial (baton-coordinator, baton-extender); a kubelet with
no cluster DNS gives the node's resolv.conf instead. */}}
{{- define "baton.hostNetwork" -}}
{{- if .Values.hostNetwork.enabled }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end }}

{{/* Host networking: the API server's address for the in-cluster client, and the listen
address under the variable `name` (the dict's `env`). */}}
{{- define "baton.hostNetworkEnv" -}}
{{- $hn := .root.Values.hostNetwork -}}
{{- if $hn.enabled }}
{{- with $hn.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with $hn.apiServer.port }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | quote }}
{{- end }}
{{- if and $hn.listenHost .env }}
- name: {{ .env }}
  value: {{ $hn.listenHost | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* A readiness and liveness probe pair on `port` (over `scheme`, HTTP by default), on the listen
address when there is one. */}}
{{- define "baton.probes" -}}
{{- $host := "" -}}
{{- if .root.Values.hostNetwork.enabled }}{{ $host = .root.Values.hostNetwork.listenHost }}{{ end -}}
readinessProbe:
  httpGet:
    path: {{ .ready | default "/readyz" }}
    port: {{ .port }}
    {{- with .scheme }}
    scheme: {{ . }}
    {{- end }}
    {{- with $host }}
    host: {{ . }}
    {{- end }}
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
    {{- with .scheme }}
    scheme: {{ . }}
    {{- end }}
    {{- with $host }}
    host: {{ . }}
    {{- end }}
  periodSeconds: 10
  {{- if not .ready }}{{/* Baton's daemons; kube-scheduler keeps the default */}}
  failureThreshold: 6
  {{- end }}
{{- end }}

{{/* Simulated GPUs and the host budget: what the device plugin and the DRA driver are told. */}}
{{- define "baton.inventoryEnv" -}}
{{- if eq .Values.gpu.backend "simulated" }}
- name: BATON_FAKE_GPUS
  value: {{ .Values.gpu.simulated.gpus | quote }}
{{- end }}
{{- if .Values.hostMemoryBudgetMiB }}
- name: BATON_HOST_MEMORY_BUDGET
  value: {{ .Values.hostMemoryBudgetMiB | int64 | toString | quote }}
{{- end }}
{{- end }}

{{/* An optional variable: set only when the value is not "". */}}
{{- define "baton.optionalEnv" -}}
{{- if ne (toString .value) "" }}
- name: {{ .name }}
  value: {{ toString .value | quote }}
{{- end }}
{{- end }}

{{/* The simulated device memory's own host directory (not inside the socket directory). */}}
{{- define "baton.fakeMemoryVolume" -}}
{{- $dir := .Values.gpu.simulated.memoryDir -}}
{{- if and (eq .Values.gpu.backend "simulated") (not (hasPrefix "/run/baton/" $dir)) -}}
{{ $dir }}
{{- end -}}
{{- end }}

{{/* The Secret holding the coordination token: the operator's, or the chart's own. */}}
{{- define "baton.coordinationSecret" -}}
{{- .Values.coordinator.token.existingSecret | default "baton-coordination" -}}
{{- end }}

{{/* Pod annotation that restarts the agents and the coordinator when coordinator.token.value
changes (both read the token once, at start); none while the chart keeps the token itself. */}}
{{- define "baton.coordinationChecksum" -}}
{{- with .Values.coordinator.token.value }}
annotations:
  checksum/coordination-token: {{ . | sha256sum | trunc 16 }}
{{- end }}
{{- end }}

{{/* Where the agent serves the coordinator's job turns (port 9464), also published on its Node
as the address the coordinator dials: the pod's IP, or with host networking the listen address
when there is one. */}}
{{- define "baton.coordinationAddress" -}}
{{- if and .Values.hostNetwork.enabled .Values.hostNetwork.listenHost -}}
{{ .Values.hostNetwork.listenHost }}:9464
{{- else -}}
$(POD_IP):9464
{{- end -}}
{{- end }}

{{/* Where agents reach the leading coordinator: its Service, or with host networking (no
cluster DNS) its listen address when there is one. */}}
{{- define "baton.coordinatorAddress" -}}
{{- if and .Values.hostNetwork.enabled .Values.hostNetwork.listenHost -}}
{{ .Values.hostNetwork.listenHost }}:50051
{{- else -}}
baton-coordinator.{{ .Release.Namespace }}.svc:50051
{{- end -}}
{{- end }}

{{/* Names and labels shared by every template. */}}

{{- define "dsplatform.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dsplatform.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's name: <fullname>-<component>, within 63 characters. */}}
{{- define "dsplatform.component" -}}
{{- printf "%s-%s" (include "dsplatform.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dsplatform.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "dsplatform.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dsplatform
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "agent"). */}}
{{- define "dsplatform.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dsplatform.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "dsplatform.componentLabels" -}}
{{ include "dsplatform.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image: repository@digest when image.digest is set (the tag is then ignored), else repository:tag. */}}
{{- define "dsplatform.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Spreading of a Deployment's replicas: topologySpreadConstraints and, when the
component sets no affinity of its own, pod anti-affinity. Pass (dict "root" $ "component" "extender" "affinity" .Values.extender.affinity). */}}
{{- define "dsplatform.spreading" -}}
{{- $a := .root.Values.availability }}
{{- if $a.topologySpread.enabled }}
topologySpreadConstraints:
{{- range $a.topologySpread.topologyKeys }}
  - maxSkew: 1
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $a.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "dsplatform.selectorLabels" (dict "root" $.root "component" $.component) | nindent 8 }}
{{- end }}
{{- end }}
{{- if .affinity }}
affinity:
  {{- toYaml .affinity | nindent 2 }}
{{- else if eq $a.podAntiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "dsplatform.selectorLabels" (dict "root" .root "component" .component) | nindent 14 }}
{{- else if eq $a.podAntiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "dsplatform.selectorLabels" (dict "root" .root "component" .component) | nindent 12 }}
{{- end }}
{{- end }}

{{/* A startupProbe on a container's health endpoint: pass (dict "root" $ "path" "/healthz" "port" "http" "scheme" "HTTP"). */}}
{{- define "dsplatform.startupProbe" -}}
startupProbe:
  httpGet:
    path: {{ .path }}
    port: {{ .port }}
    {{- with .scheme }}
    scheme: {{ . }}
    {{- end }}
  periodSeconds: {{ .root.Values.availability.startupProbe.periodSeconds }}
  failureThreshold: {{ .root.Values.availability.startupProbe.failureThreshold }}
  timeoutSeconds: 5
{{- end }}

{{- define "dsplatform.extenderURL" -}}
{{- printf "http://%s.%s.svc:%d" (include "dsplatform.component" (dict "root" . "component" "extender")) .Release.Namespace (int .Values.extender.port) }}
{{- end }}

{{/* The restricted container security context every dsplatform process runs with. */}}
{{- define "dsplatform.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The webhook's injection settings (JSON), shared by its ConfigMap and its checksum. */}}
{{- define "dsplatform.injection" -}}
{{- $inject := dict
  "image" (include "dsplatform.image" .)
  "imagePullPolicy" .Values.image.pullPolicy
  "schedulerName" (ternary .Values.scheduler.name "" (and .Values.scheduler.enabled .Values.webhook.setSchedulerName))
  "cacheDir" .Values.agent.cacheDir
  "socketDir" .Values.agent.socketDir
  "datasetsMountPath" .Values.webhook.datasetsMountPath
  "socketMountPath" .Values.webhook.socketMountPath
  "runAsUser" (int .Values.agent.runAsUser)
  "runAsGroup" (int .Values.agent.runAsGroup)
  "storageOptionsKey" .Values.webhook.storageOptionsKey
  "resources" .Values.webhook.initContainer.resources
  "volumeMode" (ternary "csi" "hostPath" (and .Values.csi.enabled .Values.agent.enabled))
  "csiDriver" .Values.csi.driverName
}}
{{- toPrettyJson $inject }}
{{- end }}

{{/* The second scheduler's KubeSchedulerConfiguration, shared by its ConfigMap and checksum. */}}
{{- define "dsplatform.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElect }}
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ .Values.scheduler.name }}
profiles:
  - schedulerName: {{ .Values.scheduler.name }}
    pluginConfig:
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: {{ .Values.scheduler.resourceScoring.type }}
            resources:
              - name: {{ .Values.gpuClasses.gpuResource }}
                weight: {{ .Values.scheduler.resourceScoring.gpuWeight }}
              - name: cpu
                weight: 1
              - name: memory
                weight: 1
extenders:
  - urlPrefix: {{ include "dsplatform.extenderURL" . }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ .Values.scheduler.extender.weight }}
    enableHTTPS: false
    nodeCacheCapable: {{ .Values.scheduler.extender.nodeCacheCapable }}
    ignorable: {{ .Values.scheduler.extender.ignorable }}
    httpTimeout: {{ .Values.scheduler.extender.httpTimeout }}
{{- end }}

{{/* The Secret holding the agents' shared peer token: agent.peers.existingSecret, else the
chart's own <fullname>-agent-peer (agent-daemonset.yaml). */}}
{{- define "dsplatform.peerSecret" -}}
{{- .Values.agent.peers.existingSecret | default (printf "%s-peer" (include "dsplatform.component" (dict "root" . "component" "agent"))) }}
{{- end }}

{{/* The port other agents dial on an agent's node: agent.peers.hostPort, else agent.port. */}}
{{- define "dsplatform.peerPort" -}}
{{- .Values.agent.peers.hostPort | default .Values.agent.port | int }}
{{- end }}

{{/* The Secret holding the agents' admin token: agent.adminToken.existingSecret, else the
chart's own <fullname>-agent-admin (agent-daemonset.yaml); and the key the token is under. */}}
{{- define "dsplatform.adminSecret" -}}
{{- .Values.agent.adminToken.existingSecret | default (printf "%s-admin" (include "dsplatform.component" (dict "root" . "component" "agent"))) }}
{{- end }}

{{- define "dsplatform.adminSecretKey" -}}
{{- ternary .Values.agent.adminToken.existingSecretKey "token" (not (empty .Values.agent.adminToken.existingSecret)) }}
{{- end }}

{{/* The webhook's serving Secret (tls.crt, tls.key): webhook.tls.existingSecret, else
<fullname>-webhook-tls (made by the chart or by cert-manager). */}}
{{- define "dsplatform.webhookTLSSecret" -}}
{{- .Values.webhook.tls.existingSecret | default (printf "%s-tls" (include "dsplatform.component" (dict "root" . "component" "webhook"))) }}
{{- end }}

{{/*
The annotations of the uninstall hook's objects (agent-release-hook.yaml): run before the
release is deleted, at the weight given (the Job after its account and rights), and removed
once it succeeded or before it runs again.
*/}}
{{- define "dsplatform.releaseHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

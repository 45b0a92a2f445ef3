{{/* Names ----------------------------------------------------------------------------------- */}}
{{- define "dolphin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dolphin.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dolphin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dolphin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dolphin.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels ---------------------------------------------------------------------------------- */}}
{{- define "dolphin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dolphin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dolphin.labels" -}}
helm.sh/chart: {{ include "dolphin.chart" . }}
{{ include "dolphin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dolphin
{{- end -}}

{{/* Labels of one component: include with (dict "ctx" $ "component" "router"). */}}
{{- define "dolphin.componentLabels" -}}
{{ include "dolphin.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dolphin.componentSelector" -}}
{{ include "dolphin.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Images ---------------------------------------------------------------------------------- */}}
{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "dolphin.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- end -}}
{{- end -}}

{{- define "dolphin.image" -}}
{{- include "dolphin.imageRef" .Values.image -}}
{{- end -}}

{{/* etcd ------------------------------------------------------------------------------------ */}}
{{- define "dolphin.etcdName" -}}
{{- printf "%s-etcd" (include "dolphin.fullname" .) -}}
{{- end -}}

{{- define "dolphin.etcdHeadless" -}}
{{- printf "%s-etcd-headless" (include "dolphin.fullname" .) -}}
{{- end -}}

{{/* The DNS name of bundled etcd member $i: include with (list $ $i). */}}
{{- define "dolphin.etcdMemberHost" -}}
{{- $ctx := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "dolphin.etcdName" $ctx) (int (index . 1)) (include "dolphin.etcdHeadless" $ctx) $ctx.Release.Namespace $ctx.Values.clusterDomain -}}
{{- end -}}

{{/* Comma-separated etcd endpoints every Dolphin process gets as DOLPHIN_ETCD. */}}
{{- define "dolphin.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "http://%s:%d" (include "dolphin.etcdMemberHost" (list $ $i)) (int $.Values.ports.etcdClient)) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else -}}
{{- join "," .Values.etcd.external.endpoints -}}
{{- end -}}
{{- end -}}

{{/* The P/D split of this release, e.g. 3p1d. */}}
{{- define "dolphin.split" -}}
{{- printf "%dp%dd" (int .Values.prefill.replicas) (int .Values.decode.replicas) -}}
{{- end -}}

{{- define "dolphin.modelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.dir) .Values.model.file -}}
{{- end -}}

{{/* True when pods need the model file (candle engine). */}}
{{- define "dolphin.needsModel" -}}
{{- if eq .Values.engine.kind "candle" -}}true{{- end -}}
{{- end -}}

{{/* Configuration checks the schema cannot express. */}}
{{- define "dolphin.validate" -}}
{{- if and .Values.etcd.bundled.enabled .Values.etcd.external.endpoints -}}
{{- fail "etcd: set either etcd.external.endpoints or etcd.bundled.enabled=true, not both" -}}
{{- end -}}
{{- if not (or .Values.etcd.bundled.enabled .Values.etcd.external.endpoints) -}}
{{- fail "etcd: set etcd.external.endpoints or etcd.bundled.enabled=true (every process registers or watches in etcd)" -}}
{{- end -}}
{{- $drain := add (int .Values.drain.waitSeconds) (int .Values.drain.graceSeconds) -}}
{{- if le (int .Values.drain.terminationGracePeriodSeconds) $drain -}}
{{- fail (printf "drain.terminationGracePeriodSeconds (%d) must exceed drain.waitSeconds + drain.graceSeconds (%d): the kubelet would kill a draining worker" (int .Values.drain.terminationGracePeriodSeconds) $drain) -}}
{{- end -}}
{{- if le (int .Values.router.terminationGracePeriodSeconds) (int .Values.router.shutdownGraceSeconds) -}}
{{- fail (printf "router.terminationGracePeriodSeconds (%d) must exceed router.shutdownGraceSeconds (%d)" (int .Values.router.terminationGracePeriodSeconds) (int .Values.router.shutdownGraceSeconds)) -}}
{{- end -}}
{{- if and .Values.learn.enabled (ne .Values.router.policy "dolphin") -}}
{{- fail "learn.enabled needs router.policy=dolphin (the router applies learned tables only under that policy)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not (and .Values.prefill.headlessService.enabled .Values.decode.headlessService.enabled)) -}}
{{- fail "serviceMonitor.enabled needs prefill.headlessService.enabled and decode.headlessService.enabled (a ServiceMonitor scrapes through Services)" -}}
{{- end -}}
{{- if and .Values.model.baked .Values.model.existingClaim -}}
{{- fail "model.baked=true uses the model inside the image: leave model.existingClaim empty" -}}
{{- end -}}
{{- $p := .Values.ports -}}
{{- $routerPorts := list (int $p.routerHttp) (int $p.routerGrpc) (int $p.routerAdmin) (int $p.routerMetrics) -}}
{{- if ne (len (uniq $routerPorts)) 4 -}}
{{- fail (printf "ports.routerHttp, .routerGrpc, .routerAdmin and .routerMetrics (%v) must differ: each is a listener of its own" $routerPorts) -}}
{{- end -}}
{{- end -}}

{{/* Pod and container security ------------------------------------------------------------- */}}
{{- define "dolphin.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "dolphin.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Env every Dolphin process gets: its pod IP as the advertise address. */}}
{{- define "dolphin.podIdentityEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: DOLPHIN_ADVERTISE_ADDR
  value: "$(POD_IP)"
{{- end -}}

{{/* The model: init container, volume and mount (include with the root context). ---------- */}}
{{- define "dolphin.modelInitContainers" -}}
{{- if and (include "dolphin.needsModel" .) (not .Values.model.baked) .Values.model.fetch }}
# The test tests/tests/chart.rs renders this chart and runs each container's command, args and
# env as real processes: every flag and env name here must be one the binary accepts.
- name: fetch-model
  image: {{ include "dolphin.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - /usr/local/bin/dolphin-fetch-model
  args: []
  env:
    - name: DOLPHIN_MODEL_DIR
      value: {{ .Values.model.dir | quote }}
    - name: HOME
      value: /tmp
    - name: PIP_NO_CACHE_DIR
      value: "1"
    {{- with .Values.model.pipIndexUrl }}
    - name: PIP_INDEX_URL
      value: {{ . | quote }}
    {{- end }}
  resources:
    {{- toYaml .Values.model.fetchResources | nindent 4 }}
  securityContext:
    {{- include "dolphin.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.dir }}
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end -}}

{{- define "dolphin.modelVolumes" -}}
{{- if and (include "dolphin.needsModel" .) (not .Values.model.baked) }}
- name: model
  {{- if .Values.model.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.sizeLimit }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "dolphin.modelMounts" -}}
{{- if and (include "dolphin.needsModel" .) (not .Values.model.baked) }}
- name: model
  mountPath: {{ .Values.model.dir }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Secret volumes (TLS for every Dolphin process, API keys for the router): include with
     (dict "ctx" $ "keys" true|false). The router reads api-keys and admin-key from the key
     Secret (dolphin.apiKeyEnv); the learn Job takes its keys as env (dolphin.learnKeyEnv). */}}
{{- define "dolphin.secretVolumes" -}}
{{- with .ctx.Values.tls.secretName }}
- name: tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if .keys }}
{{- with .ctx.Values.apiKeys.secretName }}
- name: api-keys
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}

{{- define "dolphin.secretMounts" -}}
{{- if .ctx.Values.tls.secretName }}
# TLS certificate, key and CA (DOLPHIN_TLS_*), read again when the Secret changes.
- name: tls
  mountPath: /etc/dolphin/tls
  readOnly: true
{{- end }}
{{- if and .keys .ctx.Values.apiKeys.secretName }}
# API keys (api-keys: the public API's; admin-key: the admin listener's), read again every 10 s.
- name: api-keys
  mountPath: /etc/dolphin/keys
  readOnly: true
{{- end }}
{{- end -}}

{{/* Engine env shared by both worker pools. */}}
{{- define "dolphin.engineEnv" -}}
- name: DOLPHIN_ENGINE
  value: {{ .Values.engine.kind | quote }}
- name: DOLPHIN_BLOCK_SIZE
  value: {{ .Values.blockSize | quote }}
{{- if eq .Values.engine.kind "sim" }}
- name: DOLPHIN_SIM_PROFILE
  value: {{ .Values.engine.simProfile | quote }}
- name: DOLPHIN_SIM_TIME_SCALE
  value: {{ .Values.engine.simTimeScale | quote }}
{{- else }}
- name: DOLPHIN_MODEL_PATH
  value: {{ include "dolphin.modelPath" . | quote }}
- name: DOLPHIN_WEIGHTS
  value: {{ .Values.engine.weights | quote }}
- name: DOLPHIN_DEVICE
  value: {{ .Values.engine.device | quote }}
{{- end }}
{{- with .Values.engine.modelName }}
- name: DOLPHIN_MODEL
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The router's key files when apiKeys.secretName is set (mounted by dolphin.secretMounts):
     the public HTTP and gRPC APIs then require `Bearer KEY` of api-keys, the admin listener the
     key in admin-key. */}}
{{- define "dolphin.apiKeyEnv" -}}
{{- if .Values.apiKeys.secretName }}
- name: DOLPHIN_API_KEY_FILE
  value: /etc/dolphin/keys/api-keys
- name: DOLPHIN_ADMIN_KEY_FILE
  value: /etc/dolphin/keys/admin-key
{{- end }}
{{- end -}}

{{/* The learn Job's keys when apiKeys.secretName is set: the admin key (tables, split) and one
     API key of api-keys (its inference traffic through the public gRPC API), as dolphinctl's
     --admin-key and --api-key environment names. */}}
{{- define "dolphin.learnKeyEnv" -}}
{{- with .Values.apiKeys.secretName }}
- name: DOLPHIN_ADMIN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: admin-key
- name: DOLPHIN_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: learn-api-key
{{- end }}
{{- end -}}

{{/* TLS env of every Dolphin process when tls.secretName is set: the Secret's tls.crt, tls.key
     and ca.crt (a cert-manager Certificate's Secret has all three), and the name every member's
     certificate carries (members dial each other by pod IP). dolphinctl in preStop hooks and the
     learn Job reads the same variables. */}}
{{- define "dolphin.tlsEnv" -}}
{{- if .Values.tls.secretName }}
{{- if not .Values.tls.serverName }}
{{- fail "tls.serverName is required with tls.secretName: the DNS name (SAN) every member certificate carries" }}
{{- end }}
- name: DOLPHIN_TLS_CERT
  value: /etc/dolphin/tls/tls.crt
- name: DOLPHIN_TLS_KEY
  value: /etc/dolphin/tls/tls.key
- name: DOLPHIN_TLS_CA
  value: /etc/dolphin/tls/ca.crt
- name: DOLPHIN_TLS_SERVER_NAME
  value: {{ .Values.tls.serverName | quote }}
{{- end }}
{{- end -}}

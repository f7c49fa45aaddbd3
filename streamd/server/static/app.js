// The browser client of streamd's protocol v1 (docs/protocol.md): microphone -> AudioWorklet ->
// 16-bit PCM at the audio context's rate over the websocket (the server resamples); partials and
// finals are shown live, each stream in a section of its own; the transcript can be copied or
// downloaded as text. The page's state is in the DOM for scripts and tests:
// body[data-state] (idle, connecting, listening, stopping, closed, error), body[data-endpoint],
// #level (the microphone's level in dBFS while listening), one section.session[data-started]
// (and [data-ended]) per stream, with one .finals li[data-reason][data-start][data-end] with a
// .text span per final.
'use strict';

const BLOCK_S = 0.05;        // 50 ms per message
const LEVEL_FLOOR_DB = -60;  // the meter's bottom
const $ = (id) => document.getElementById(id);
let session = null;          // {ws, mic, error, summary, ready, section} while a stream is open

function setState(state, message) {
  document.body.dataset.state = state;
  $('status').textContent = message;
  $('toggle').textContent = state === 'listening' ? 'Stop' : 'Start';
  $('toggle').disabled = state === 'connecting' || state === 'stopping';
}

// ws:// next to http:// (localhost), wss:// next to https:// (browsers allow the microphone
// only on secure origins, and a secure page may not open a ws:// socket). A daemon that needs a
// token gets the one in this page's URL (/?token=...): browsers cannot set websocket headers.
function streamUrl() {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const token = new URLSearchParams(location.search).get('token');
  const query = token ? `?token=${encodeURIComponent(token)}` : '';
  return `${scheme}//${location.host}/v1/stream${query}`;
}

function formatTime(seconds) {
  const minutes = Math.floor(seconds / 60);
  return `${String(minutes).padStart(2, '0')}:${(seconds - 60 * minutes).toFixed(2).padStart(5, '0')}`;
}

const pad = (n) => String(n).padStart(2, '0');
const day = (d) => `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
const clock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;

// A section for a stream that began now, headed by its number and local start time.
function openSection() {
  const started = new Date();
  const section = document.createElement('section');
  section.className = 'session';
  section.dataset.started = started.toISOString();
  const heading = document.createElement('h3');
  heading.textContent = `Session ${document.querySelectorAll('.session').length + 1}, ` +
    `${day(started)} ${clock(started)}`;
  const finals = document.createElement('ol');
  finals.className = 'finals';
  section.append(heading, finals);
  $('sessions').append(section);
  return section;
}

function closeSection(section) {
  const ended = new Date();
  section.dataset.ended = ended.toISOString();
  section.querySelector('h3').textContent += ` – ${clock(ended)}`;
}

// The transcript as text: per session its heading, then one line per utterance.
function transcriptText() {
  return [...document.querySelectorAll('.session')].map((section) => [
    section.querySelector('h3').textContent,
    ...[...section.querySelectorAll('.finals .text')].map((text) => text.textContent),
  ].join('\n') + '\n').join('\n');
}

function flash(button, label) {
  const was = button.textContent;
  button.textContent = label;
  setTimeout(() => { button.textContent = was; }, 1500);
}

async function copyTranscript() {
  const text = transcriptText();
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {  // no clipboard API: a plain http:// page on a host other than localhost
    const area = document.createElement('textarea');
    area.value = text;
    document.body.append(area);
    area.select();
    const copied = document.execCommand('copy');
    area.remove();
    if (!copied) {
      flash($('copy'), 'Copy failed');
      return;
    }
  }
  flash($('copy'), 'Copied');
}

function downloadTranscript() {
  const started = new Date(document.querySelector('.session').dataset.started);
  const link = document.createElement('a');
  link.href = URL.createObjectURL(new Blob([transcriptText()], {type: 'text/plain;charset=utf-8'}));
  link.download = `streamd-${day(started)}-${clock(started).replaceAll(':', '')}.txt`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function showFinal(msg) {
  $('partial').textContent = '';
  if (!msg.text) return;
  const item = document.createElement('li');
  Object.assign(item.dataset, {reason: msg.reason, start: msg.start, end: msg.end});
  const time = document.createElement('span');
  time.className = 'time';
  time.textContent = `${formatTime(msg.start)} – ${formatTime(msg.end)}`;
  const text = document.createElement('span');
  text.className = 'text';
  text.textContent = msg.text;
  item.append(time, text);
  session.section.querySelector('.finals').append(item);
  $('copy').disabled = $('download').disabled = false;
}

function onMessage(msg) {
  switch (msg.type) {
    case 'ready':
      session.ready = true;
      session.section = openSection();
      setState('listening', `Listening (${msg.sample_rate} Hz)…`);
      $('session').textContent = `${msg.model} on ${msg.device} (${msg.dtype}), ` +
        `${msg.chunk_ms} ms chunks, session ${msg.session_id}`;
      break;
    case 'partial':
      $('partial').textContent = msg.text;
      break;
    case 'final':
      showFinal(msg);
      break;
    case 'error':
      session.error = `${msg.code}: ${msg.message}`;
      break;
    case 'summary':
      session.summary = msg;
      break;
  }
}

// Why no stream can be opened now (the server is gone, or its /readyz names a reason), or null.
async function serverProblem() {
  let response;
  try {
    response = await fetch('readyz', {cache: 'no-store'});
  } catch (e) {
    return `Cannot reach the server at ${location.host}: is streamd still running?`;
  }
  if (response.ok) return null;
  const body = await response.json().catch(() => ({}));
  const why = body.reason === 'full' ? 'at capacity' : body.reason || `HTTP ${response.status}`;
  return `The server takes no new streams now (${why}); try again later.`;
}

// Why this page may not open a stream (no token, a wrong one, an origin not allowed), or null.
// Browsers do not show why a websocket handshake failed, so the page asks first with a plain GET
// of the stream path, which answers what the handshake would get (docs/protocol.md, Access).
async function accessProblem() {
  let response;
  try {
    response = await fetch(streamUrl().replace(/^ws/, 'http'), {cache: 'no-store'});
  } catch (e) {
    return null;  // the handshake will tell
  }
  if (![400, 401, 403].includes(response.status)) return null;
  const said = (await response.text()).trim();
  if (response.status !== 401) return `The server refused this page (HTTP ${response.status}: ${said}).`;
  return new URLSearchParams(location.search).get('token')
    ? `The server refused the token in this page's address (${said}): open the page as /?token=TOKEN ` +
      'with the token the server was started with.'
    : `The server needs a token (${said}): open the page as /?token=TOKEN.`;
}

async function openMicrophone() {
  let media;
  try {
    media = await navigator.mediaDevices.getUserMedia(
      {audio: {channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  } catch (e) {
    throw new Error(`Microphone unavailable: ${e.message}`);
  }
  const context = new AudioContext();
  try {
    await context.audioWorklet.addModule('capture-worklet.js');
  } catch (e) {
    media.getTracks().forEach((track) => track.stop());
    context.close();
    throw new Error(`Could not load the audio capture script from the server: ${e.message}`);
  }
  const node = new AudioWorkletNode(context, 'pcm-capture',
    {processorOptions: {blockSize: Math.round(context.sampleRate * BLOCK_S)}});
  const source = context.createMediaStreamSource(media);
  source.connect(node);
  node.connect(context.destination);  // keeps the graph pulling the node; it outputs silence
  return {media, context, node, meter: levelMeter(context, source)};
}

// Shows the input's level (RMS over the last ~40 ms, in dBFS) on #level ten times a second;
// returns the timer.
function levelMeter(context, source) {
  const analyser = context.createAnalyser();
  analyser.fftSize = 2048;
  source.connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  return setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    const power = samples.reduce((sum, x) => sum + x * x, 0) / samples.length;
    const db = Math.max(LEVEL_FLOOR_DB, 10 * Math.log10(power || 1e-12));
    $('level').value = db;
    $('level').title = `input level ${db.toFixed(0)} dBFS`;
  }, 100);
}

function releaseMicrophone(mic) {
  clearInterval(mic.meter);
  $('level').value = LEVEL_FLOOR_DB;
  mic.node.port.onmessage = null;
  mic.media.getTracks().forEach((track) => track.stop());
  if (mic.context.state !== 'closed') mic.context.close();
}

function onClose(event) {
  releaseMicrophone(session.mic);
  const {error, summary, ready, section} = session;
  session = null;
  if (section) closeSection(section);
  if (error) {
    setState('error', `Error: ${error}`);
  } else if (summary) {
    const why = summary.reason === 'shutdown' ? 'the server is shutting down' : 'stopped';
    setState('closed', `Done (${why}): ${summary.utterances} utterances, ${summary.audio_seconds.toFixed(1)} s of audio.`);
  } else if (!ready) {
    setState('error', `The server refused or dropped the stream before it began (code ${event.code}); ` +
      'try again later.');
  } else {
    setState('error', `Connection closed (code ${event.code}).`);
  }
}

async function start() {
  setState('connecting', 'Checking the server…');
  const problem = await serverProblem() || await accessProblem();
  if (problem) {
    setState('error', problem);
    return;
  }
  setState('connecting', 'Opening the microphone…');
  let mic;
  try {
    mic = await openMicrophone();
  } catch (e) {
    setState('error', e.message);
    return;
  }
  const url = streamUrl();
  document.body.dataset.endpoint = url;
  setState('connecting', `Connecting to ${url}…`);
  const ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  session = {ws, mic, error: null, summary: null, ready: false, section: null};
  ws.onopen = () => ws.send(JSON.stringify(
    {type: 'start', sample_rate: mic.context.sampleRate, encoding: 's16le'}));
  mic.node.port.onmessage = (event) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(event.data);
  };
  ws.onmessage = (event) => onMessage(JSON.parse(event.data));
  ws.onclose = onClose;
}

function stop() {
  setState('stopping', 'Finishing…');
  releaseMicrophone(session.mic);
  session.ws.send(JSON.stringify({type: 'stop'}));
}

$('toggle').addEventListener('click', () => (session ? stop() : start()));
$('copy').addEventListener('click', copyTranscript);
$('download').addEventListener('click', downloadTranscript);

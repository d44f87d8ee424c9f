// The playground: chat with the served model, steered by one slider per attribute.
// It uses only the server's public API: /playground/config for the model and its
// default attributes, /v1/chat/completions (streamed) and /v1/rewards.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "helpsteer-jax-api-key";
const state = {config: null, history: [], controller: null};

function requestHeaders() {
  const headers = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message ?? `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function addSlider(name, value) {
  const row = element("label", "attribute");
  const input = Object.assign(document.createElement("input"), {
    type: "range", min: 0, max: 4, step: 1, value, name, id: `attribute-${name}`});
  const shown = element("output", "", String(value));
  input.addEventListener("input", () => { shown.textContent = input.value; });
  row.append(element("span", "name", name), input, shown);
  $("attributes").append(row);
}

function attributes() {
  const values = {};
  for (const input of $("attributes").querySelectorAll("input[type=range]")) {
    values[input.name] = Number(input.value);
  }
  return values;
}

function labelString(values) {
  return Object.entries(values).map(([name, value]) => `${name}:${value}`).join(",");
}

function addTurn(role, text) {
  const turn = element("li", `turn ${role}`);
  turn.append(element("div", "role", role === "user" ? "You" : state.config.model));
  const body = element("div", role === "user" ? "text" : "answer", text);
  turn.append(body);
  $("messages").append(turn);
  turn.scrollIntoView({block: "end"});
  return {turn, body};
}

// Server-sent events of a chat completion: calls onDelta with each piece of text,
// returns the usage chunk's counts.
async function readStream(response, onDelta) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", usage = null;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) throw new Error("the stream ended before [DONE]");
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trimStart();
        if (data === "[DONE]") return usage;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        usage = chunk.usage ?? usage;
        const delta = chunk.choices?.[0]?.delta?.content;
        if (delta) onDelta(delta);
      }
    }
  }
}

async function showScores(turn, messages, answer) {
  const scores = element("div", "scores", "scoring…");
  turn.append(scores);
  const response = await fetch("v1/rewards", {
    method: "POST", headers: requestHeaders(),
    body: JSON.stringify({items: [{messages, response: answer}]})});
  if (!response.ok) {
    scores.textContent = `scores: ${await errorText(response)}`;
    return;
  }
  const row = (await response.json()).data[0];
  scores.textContent = "";
  if (!row.attributes) {
    scores.textContent = "too long for the attribute model";
    return;
  }
  for (const [name, value] of Object.entries(row.attributes)) {
    const score = element("span", "score");
    score.dataset.attribute = name;
    score.dataset.value = String(value);
    score.append(element("span", "name", name), element("span", "value", value.toFixed(2)));
    scores.append(score);
  }
  const reward = element("span", "score reward");
  reward.dataset.value = String(row.reward);
  reward.append(element("span", "name", "reward"), element("span", "value", row.reward.toFixed(2)));
  scores.append(reward);
  turn.dataset.scored = "true";
}

function setBusy(controller) {
  state.controller = controller;
  $("send").textContent = controller ? "Stop" : "Send";
  $("new-chat").disabled = Boolean(controller);
}

async function send(event) {
  event.preventDefault();
  if (state.controller) {
    state.controller.abort();
    return;
  }
  const text = $("prompt").value.trim();
  if (!text) return;
  const system = $("system").value.trim();
  const values = attributes();
  const messages = [...(system ? [{role: "system", content: system}] : []),
                    ...state.history, {role: "user", content: text}];
  const body = {model: state.config.model, messages, stream: true, attributes: values,
                stream_options: {include_usage: true}};
  const temperature = $("temperature").value;
  if (temperature !== "") body.temperature = Number(temperature);
  const maxTokens = $("max-tokens").value;
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);

  $("status").textContent = "";
  const user = addTurn("user", text);
  const assistant = addTurn("assistant", "");
  assistant.turn.dataset.state = "streaming";
  assistant.turn.insertBefore(element("div", "label", labelString(values)), assistant.body);
  const controller = new AbortController();
  setBusy(controller);
  const start = performance.now();
  let answer = "";
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: requestHeaders(), body: JSON.stringify(body),
      signal: controller.signal});
    if (!response.ok) throw new Error(await errorText(response));
    const usage = await readStream(response, (delta) => {
      answer += delta;
      assistant.body.textContent += delta;
    });
    const seconds = (performance.now() - start) / 1000;
    const tokens = usage?.completion_tokens;
    assistant.turn.append(element("div", "meta", tokens === undefined ? `${seconds.toFixed(1)} s`
        : `${tokens} tokens in ${seconds.toFixed(1)} s`));
    assistant.turn.dataset.state = "done";
  } catch (error) {
    const stopped = error.name === "AbortError";
    if (!stopped || !answer) {
      // Nothing to keep: take the turns back and leave the prompt for a retry.
      user.turn.remove();
      assistant.turn.remove();
      $("status").textContent = stopped ? "stopped" : error.message;
      setBusy(null);
      return;
    }
    assistant.turn.dataset.state = "stopped";
    assistant.turn.append(element("div", "meta", "stopped"));
  }
  setBusy(null);
  state.history.push({role: "user", content: text}, {role: "assistant", content: answer});
  $("prompt").value = "";
  if (state.config.rewards) {
    try {
      await showScores(assistant.turn, messages, answer);
    } catch (error) {
      $("status").textContent = `scores: ${error.message}`;
    }
  }
}

function newChat() {
  state.history = [];
  $("messages").replaceChildren();
  $("status").textContent = "";
}

async function start() {
  const response = await fetch("playground/config");
  if (!response.ok) {
    $("status").textContent = `cannot read the server's settings: ${await errorText(response)}`;
    return;
  }
  const config = state.config = await response.json();
  document.title = `${config.model} · helpsteer-jax playground`;
  $("model").textContent = config.model;
  $("key-row").hidden = !config.api_key;
  $("api-key").value = sessionStorage.getItem(KEY_STORAGE) ?? "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
  });
  $("system").value = config.system;
  $("temperature").value = config.temperature;
  $("max-tokens").max = config.max_tokens;
  for (const [name, value] of Object.entries(config.attributes)) addSlider(name, value);
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("new-chat").addEventListener("click", newChat);
  document.body.dataset.ready = "true";
}

start();

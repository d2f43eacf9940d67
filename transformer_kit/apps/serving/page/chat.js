// The chat page of transformer-kit serve: sends the conversation to POST /v1/chat/completions with
// stream=true and shows the reply as its server-sent events arrive, the reasoning (a delta's
// reasoning_content, or vLLM's reasoning) in a block of its own. Whatever the user or the model
// wrote is put in the page with textContent, never parsed as HTML. The API key lives in the
// password field only: sent as "Authorization: Bearer", never put in a URL or the browser's storage.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const history = [];  // the turns answered so far: {role, content}, sent with each request
  let model = null;  // the served model's name, from GET /v1/models
  let controller = null;  // aborts the request in flight (the Stop button)
  let conversation = 0;  // counts New chat: a reply of an earlier conversation stays out of history

  function headers() {
    const result = {"Content-Type": "application/json"};
    const key = $("api-key").value.trim();
    if (key) result.Authorization = `Bearer ${key}`;
    return result;
  }

  // The sentence of an OpenAI-style error answer, else the status.
  async function errorSentence(response) {
    try {
      const body = await response.json();
      if (body && body.error && typeof body.error.message === "string") return body.error.message;
    } catch (_) { /* not JSON: the status says it */ }
    return `The server answered ${response.status} ${response.statusText}.`;
  }

  // The served model's name, or null after showing why it could not be read.
  async function modelName() {
    const response = await fetch("/v1/models", {headers: headers()});
    if (!response.ok) {
      const sentence = await errorSentence(response);
      $("status").textContent = response.status === 401
        ? "This server needs an API key: enter it in the API key field." : sentence;
      return {error: sentence};
    }
    const body = await response.json();
    $("status").textContent = "";
    $("model").textContent = body.data[0].id;
    return {name: body.data[0].id};
  }

  // A message in the conversation: its element and the element its text goes in.
  function message(role) {
    const root = document.createElement("div");
    root.className = `message ${role}`;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role;
    const text = document.createElement("div");
    text.className = "text";
    root.append(label, text);
    $("messages").append(root);
    return {root, text};
  }

  function scrollDown() {
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
  }

  // The reasoning block of a reply, made when its first thought arrives (open while it streams).
  function reasoningOf(reply) {
    if (!reply.thought) {
      const block = document.createElement("details");
      block.className = "reasoning";
      block.open = true;
      const summary = document.createElement("summary");
      summary.textContent = "Reasoning";
      reply.thought = document.createElement("div");
      reply.thought.className = "thought";
      block.append(summary, reply.thought);
      reply.root.insertBefore(block, reply.text);
    }
    return reply.thought;
  }

  function fail(reply, sentence) {
    const error = document.createElement("div");
    error.className = "error";
    error.textContent = sentence;
    reply.root.append(error);
    reply.root.dataset.state = "error";
  }

  // The data of each server-sent event of a response, as it arrives.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      buffer += decoder.decode(value, {stream: !done}).replace(/\r/g, "");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const lines = buffer.slice(0, end).split("\n");
        buffer = buffer.slice(end + 2);
        const data = lines.filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
        if (data) yield data;
      }
      if (done) return;
    }
  }

  // The request's options: only those the user set, so the server's defaults hold otherwise.
  function options() {
    const body = {};
    const temperature = $("temperature").value.trim();
    if (temperature !== "") body.temperature = Number(temperature);
    const maxTokens = $("max-tokens").value.trim();
    if (maxTokens !== "") body.max_tokens = Number(maxTokens);
    const stop = $("stop").value.split("\n").filter((line) => line !== "")
      .map((line) => line.replaceAll("\\n", "\n"));
    if (stop.length) body.stop = stop;
    return body;
  }

  // Reads the streamed reply into `reply`; its content, or null if the stream ended with an error.
  async function readReply(response, reply) {
    let content = "", reasoning = "", finish = null;
    for await (const data of events(response)) {
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) {
        fail(reply, event.error.message);
        return null;
      }
      for (const choice of event.choices || []) {
        const delta = choice.delta || {};
        const thought = typeof delta.reasoning_content === "string" ? delta.reasoning_content : delta.reasoning;
        if (typeof thought === "string" && thought) {
          reasoning += thought;
          reasoningOf(reply).textContent = reasoning;
        }
        if (typeof delta.content === "string" && delta.content) {
          if (!content && reply.thought) reply.thought.parentElement.open = false;
          content += delta.content;
          reply.text.textContent = content;
        }
        if (delta.tool_calls) reply.text.textContent = content + JSON.stringify(delta.tool_calls);
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      scrollDown();
    }
    reply.root.dataset.finish = finish || "";
    if (finish === "length") {
      const note = document.createElement("div");
      note.className = "finish";
      note.textContent = "cut at the maximum tokens";
      reply.root.append(note);
    }
    reply.root.dataset.state = "done";
    return content;
  }

  async function send(text) {
    const user = {role: "user", content: text}, turn = conversation;
    message("user").text.textContent = text;
    const reply = message("assistant");
    scrollDown();
    busy(true);
    controller = new AbortController();
    try {
      if (!model) {
        const found = await modelName();
        if (found.error) return fail(reply, found.error);
        model = found.name;
      }
      const system = $("system").value;
      const messages = [...(system ? [{role: "system", content: system}] : []), ...history, user];
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), signal: controller.signal,
        body: JSON.stringify({model, messages, stream: true, ...options()}),
      });
      if (!response.ok) return fail(reply, await errorSentence(response));
      const content = await readReply(response, reply);
      if (content !== null && turn === conversation) history.push(user, {role: "assistant", content});
    } catch (error) {
      if (error.name === "AbortError") {
        reply.root.dataset.state = "stopped";
        if (turn === conversation) history.push(user, {role: "assistant", content: reply.text.textContent});
      } else {
        fail(reply, `The request failed: ${error.message}`);
      }
    } finally {
      controller = null;
      busy(false);
    }
  }

  function busy(on) {
    $("send").disabled = on;
    $("halt").disabled = !on;
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value;
    if (!text.trim() || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("halt").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", () => {
    if (controller) controller.abort();
    conversation += 1;
    history.length = 0;
    $("messages").replaceChildren();
  });
  $("api-key").addEventListener("input", () => { model = null; });
  modelName().then((found) => { if (!found.error) model = found.name; },
                   (error) => { $("status").textContent = `The server cannot be reached: ${error.message}`; });
})();

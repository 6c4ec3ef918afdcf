// Search on demand (and search from the file system). Inlined by hooks.on_post_page.
//
// Material's bundle starts its search worker and downloads search/search_index.json
// (the whole site's text) on every page load, before anyone searches. This script
// holds both back until the reader shows intent to search: focus on the search field,
// a pointer over or a tap on the search button, or a search shortcut key. Material's
// own search UI, suggestions, highlighting and section anchors are untouched: its
// request and its worker simply start later (on hover, usually before the click).
(function () {
  "use strict";
  var start;
  var wanted = new Promise(function (resolve) {
    start = resolve;
  });
  // A page opened from a search result (?h=term) highlights the term, which needs the
  // index's configuration: that reader is searching already.
  if (/[?&]h=/.test(location.search)) start();
  function intent(event) {
    var target = event.target;
    if (target && target.closest && target.closest(".md-search, label[for='__search']")) start();
  }
  ["focusin", "pointerover", "touchstart", "click"].forEach(function (type) {
    document.addEventListener(type, intent, { capture: true, passive: true });
  });
  // Material's search shortcuts.
  document.addEventListener(
    "keydown",
    function (event) {
      if (["s", "S", "f", "F", "/"].indexOf(event.key) >= 0) start();
    },
    true
  );

  // 1. The index request: Material fetches it with XMLHttpRequest; delay its send().
  var INDEX = /\/search\/search_index\.json$/;
  var open = XMLHttpRequest.prototype.open;
  var send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url) {
    this.infralensIndex = INDEX.test(String(url));
    return open.apply(this, arguments);
  };
  XMLHttpRequest.prototype.send = function () {
    var xhr = this;
    var args = arguments;
    if (!xhr.infralensIndex) return send.apply(xhr, args);
    wanted.then(function () {
      send.apply(xhr, args);
    });
  };

  // 2. The search worker: hand Material a stand-in that queues messages and listeners,
  // and create the real worker (and fetch its script) only when search is wanted.
  // Read from the file system (the offline build), a page cannot start a worker from a
  // file: the worker's script then runs in a hidden frame, with the same messages.
  var NativeWorker = window.Worker;
  var RealWorker = location.protocol === "file:" ? FrameWorker : NativeWorker;
  var SEARCH_WORKER = /\/workers\/search\.[0-9a-f]+\.min\.js$/;
  function LazyWorker(url, options) {
    var worker = null;
    var queue = [];
    var listeners = [];
    var terminated = false;
    wanted.then(function () {
      if (terminated) return;
      worker = new RealWorker(url, options);
      listeners.forEach(function (l) {
        worker.addEventListener(l[0], l[1], l[2]);
      });
      queue.forEach(function (args) {
        worker.postMessage.apply(worker, args);
      });
      queue = [];
    });
    this.postMessage = function () {
      if (worker) worker.postMessage.apply(worker, arguments);
      else queue.push(arguments);
    };
    this.addEventListener = function (type, fn, opts) {
      listeners.push([type, fn, opts]);
      if (worker) worker.addEventListener(type, fn, opts);
    };
    this.removeEventListener = function (type, fn, opts) {
      listeners = listeners.filter(function (l) {
        return !(l[0] === type && l[1] === fn);
      });
      if (worker) worker.removeEventListener(type, fn, opts);
    };
    this.terminate = function () {
      terminated = true;
      if (worker) worker.terminate();
    };
  }
  // The worker's script in a hidden same-origin frame: what it posts reaches the page's
  // listeners, and what the page posts reaches its "message" listeners, asynchronously
  // as with a worker. (Material's offline plugin gets this from the iframe-worker shim
  // on a CDN; this site makes no request to another host.)
  function FrameWorker(url) {
    var stub = this;
    var listeners = [];
    var queue = [];
    var ready = false;
    var frame = document.createElement("iframe");
    frame.hidden = true;
    frame.title = "Search worker";
    frame.setAttribute("aria-hidden", "true");
    frame.setAttribute("tabindex", "-1");
    document.body.appendChild(frame);
    var scope = frame.contentWindow;
    scope.postMessage = function (data) {
      setTimeout(function () {
        var event = new MessageEvent("message", { data: data });
        listeners.forEach(function (l) {
          if (l[0] === "message") l[1].call(stub, event);
        });
      });
    };
    function send(data) {
      setTimeout(function () {
        scope.dispatchEvent(new scope.MessageEvent("message", { data: data }));
      });
    }
    var script = scope.document.createElement("script");
    script.src = new URL(url, location.href).href;
    script.onload = function () {
      ready = true;
      queue.forEach(send);
      queue = [];
    };
    scope.document.body.appendChild(script);
    this.postMessage = function (data) {
      if (ready) send(data);
      else queue.push(data);
    };
    this.addEventListener = function (type, fn) {
      listeners.push([type, fn]);
    };
    this.removeEventListener = function (type, fn) {
      listeners = listeners.filter(function (l) {
        return !(l[0] === type && l[1] === fn);
      });
    };
    this.terminate = function () {
      frame.remove();
    };
  }

  window.Worker = function (url, options) {
    if (!SEARCH_WORKER.test(String(url))) return new NativeWorker(url, options);
    return new LazyWorker(url, options);
  };
})();

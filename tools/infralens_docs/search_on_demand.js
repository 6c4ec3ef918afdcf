// Search on demand (and search from the file system). Inlined by hooks.on_post_page.
//
// Material's bundle starts its search worker and downloads search/search_index.json
// (the site's searchable text) on every page load, before anyone searches. This script
// holds both back until the reader shows intent to search: focus on the search field,
// a pointer over or a tap on the search button, or a search shortcut key. Material's
// own search UI, suggestions, highlighting and section anchors are untouched.
//
// At that intent it also starts them itself, without waiting for the bundle, which may
// still be loading and starting (bundle_on_interaction.js starts it on the same first
// interaction, and holds the main thread while it starts): it starts the search
// worker, which fetches the index and builds its lunr index (most of the time to the
// first results) meanwhile. The worker the bundle then asks for is that one, and the
// bundle's own request for the index is answered with the index's configuration alone
// (all the bundle reads of it besides the documents it would send that worker).
(function () {
  "use strict";
  var NativeWorker = window.Worker;
  var SETUP = 0; // Material's search worker messages (SearchMessageType)
  var READY = 1;
  var early = null; // what start() began: the index's request and the worker
  var resolveWanted;
  var wanted = new Promise(function (resolve) {
    resolveWanted = resolve;
  });
  var started = false;
  function start() {
    if (started) return;
    started = true;
    early = startEarly();
    resolveWanted();
  }
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

  // 1. The early start: the index's URL and the worker's as the bundle forms them (from
  // the page's __config). The worker fetches the index itself, off the page's main thread,
  // sets itself up with it as the bundle's SETUP message would, and sends the page the
  // index's configuration. Not from the file system: there the bundle loads the index
  // with a <script>, and the worker runs in a frame.
  function startEarly() {
    var script = document.getElementById("__config");
    if (location.protocol === "file:" || !script || !document.forms.namedItem("search")) return null;
    try {
      var config = JSON.parse(script.textContent);
      var index = new URL("search/search_index.json", new URL(config.base, location.href)).href;
      var workerUrl = new URL(config.search, location.href).href;
      var suggest = (config.features || []).indexOf("search.suggest") >= 0;
      var source = "(" + earlyWorker + ")(" + JSON.stringify([workerUrl, index, suggest]) + ");";
      var worker = new NativeWorker(URL.createObjectURL(new Blob([source], { type: "text/javascript" })));
    } catch (error) {
      return null;
    }
    var loaded = new Promise(function (resolve, reject) {
      worker.addEventListener("error", reject); // (a worker that could not start)
      worker.addEventListener("message", function listen(event) {
        if (!event.data || !("infralensIndex" in event.data)) return;
        worker.removeEventListener("message", listen);
        if (event.data.infralensIndex) resolve(event.data.infralensIndex);
        else reject(new Error("search index not loaded"));
      });
    });
    loaded.catch(function () {}); // (the bundle's own request and SETUP then go ahead)
    var state = { index: index, loaded: loaded, worker: worker, workerUrl: workerUrl };
    state.taken = false; // the bundle's worker is this one
    state.built = false; // the worker has answered READY (its lunr index is built)
    worker.addEventListener("message", function (event) {
      if (event.data && event.data.type === READY) state.built = true;
    });
    return state;
  }
  // The early worker's script (its source is this function's): the index's request
  // first, then Material's search worker (its relative imports, a language's stemmer,
  // resolved from its own URL as they would be), set up with the index.
  function earlyWorker(args) {
    var workerUrl = args[0];
    var text = fetch(args[1]).then(function (response) {
      if (!response.ok) throw new Error(response.statusText);
      return response.text();
    });
    var load = self.importScripts;
    self.importScripts = function () {
      var urls = Array.prototype.map.call(arguments, function (url) {
        return new URL(url, workerUrl).href;
      });
      return load.apply(self, urls);
    };
    load(workerUrl);
    text
      .then(function (body) {
        return JSON.parse(body);
      })
      .then(
        function (data) {
          postMessage({ infralensIndex: { config: data.config, docs: [] } });
          var options = { suggest: args[2] };
          // SETUP, as the page would send it (the source runs alone: no SETUP constant)
          var setup = { type: 0, data: { config: data.config, docs: data.docs, options: options } };
          dispatchEvent(new MessageEvent("message", { data: setup }));
        },
        function () {
          postMessage({ infralensIndex: null });
        }
      );
  }

  // 2. The index request: Material fetches it with XMLHttpRequest; delay its send() until
  // the reader's intent, then answer it with the early start's configuration.
  var INDEX = /\/search\/search_index\.json$/;
  var open = XMLHttpRequest.prototype.open;
  var send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url) {
    this.infralensIndex = INDEX.test(String(url)) ? new URL(url, location.href).href : null;
    return open.apply(this, arguments);
  };
  XMLHttpRequest.prototype.send = function () {
    var xhr = this;
    var args = arguments;
    if (!xhr.infralensIndex) return send.apply(xhr, args);
    wanted.then(function () {
      if (!early || early.index !== xhr.infralensIndex) return send.apply(xhr, args);
      early.loaded.then(
        function (index) {
          respond(xhr, JSON.stringify(index));
        },
        function () {
          send.apply(xhr, args);
        }
      );
    });
  };
  // A request answered with a body at hand: status, the body in the responseType asked
  // for (Material asks for a blob), and the events a finished request fires.
  function respond(xhr, body) {
    var type = xhr.responseType;
    var response = type === "blob" ? new Blob([body], { type: "application/json" }) : body;
    if (type === "json") response = JSON.parse(body);
    var fields = { readyState: 4, status: 200, statusText: "OK", response: response };
    if (!type || type === "text") fields.responseText = body;
    Object.keys(fields).forEach(function (key) {
      Object.defineProperty(xhr, key, { value: fields[key] });
    });
    xhr.dispatchEvent(new Event("readystatechange"));
    xhr.dispatchEvent(new ProgressEvent("load"));
    xhr.dispatchEvent(new ProgressEvent("loadend"));
  }

  // 3. The search worker: hand Material a stand-in that queues messages and listeners,
  // and, when search is wanted, create the real worker (and fetch its script) or take
  // the early start's. That one has its SETUP already: the bundle's SETUP is not sent
  // again, and its READY reaches the bundle only after the bundle's SETUP, as a worker's
  // would. Read from the file system (the offline build), a page cannot start a worker
  // from a file: the worker's script then runs in a hidden frame, with the same messages.
  var RealWorker = location.protocol === "file:" ? FrameWorker : NativeWorker;
  var SEARCH_WORKER = /\/workers\/search\.[0-9a-f]+\.min\.js$/;
  function LazyWorker(url, options) {
    var stub = this;
    var worker = null;
    var taken = null; // the early start, when its worker is this one
    var askedSetup = false; // the bundle has sent SETUP
    var queue = [];
    var listeners = [];
    var terminated = false;
    function deliver(event) {
      listeners.forEach(function (l) {
        if (l[0] === "message") l[1].call(stub, event);
      });
    }
    function relay(event) {
      var data = event.data;
      if (data && "infralensIndex" in data) return; // for the page, not the bundle
      if (data && data.type === READY && !askedSetup) return; // held until the bundle's SETUP
      deliver(event);
    }
    function post(args) {
      var message = args[0];
      if (!taken || !message || message.type !== SETUP) return worker.postMessage.apply(worker, args);
      askedSetup = true;
      taken.loaded.then(
        function () {
          if (taken.built) deliver(new MessageEvent("message", { data: { type: READY } }));
        },
        function () {
          worker.postMessage.apply(worker, args); // the early start failed: set up as asked
        }
      );
    }
    function attach(l) {
      if (!taken || l[0] !== "message") worker.addEventListener(l[0], l[1], l[2]);
    }
    wanted.then(function () {
      if (terminated) return;
      if (early && !early.taken && early.workerUrl === new URL(url, location.href).href) {
        taken = early;
        taken.taken = true;
        worker = taken.worker;
        worker.addEventListener("message", relay);
      } else {
        worker = new RealWorker(url, options);
      }
      listeners.forEach(attach);
      queue.forEach(post);
      queue = [];
    });
    this.postMessage = function () {
      if (worker) post(arguments);
      else queue.push(arguments);
    };
    this.addEventListener = function (type, fn, opts) {
      listeners.push([type, fn, opts]);
      if (worker) attach([type, fn, opts]);
    };
    this.removeEventListener = function (type, fn, opts) {
      listeners = listeners.filter(function (l) {
        return !(l[0] === type && l[1] === fn);
      });
      if (worker && !(taken && type === "message")) worker.removeEventListener(type, fn, opts);
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

  // A page opened from a search result (?h=term) highlights the term, which needs the
  // index's configuration: that reader is searching already.
  if (/[?&]h=/.test(location.search)) start();
})();

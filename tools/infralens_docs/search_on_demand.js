// Search on demand. Inlined by hooks.on_post_page just before Material's bundle.
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
  var RealWorker = window.Worker;
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
  window.Worker = function (url, options) {
    if (!SEARCH_WORKER.test(String(url))) return new RealWorker(url, options);
    return new LazyWorker(url, options);
  };
})();
